/* Data-link frames: wire_frame_unpack on any bytes (common/wire.h), the
 * [u32 n][n bytes envelope][payload] framing and the KV frame header rules
 * (lengths, layer range, dtype, checksum).
 *
 * Properties: no crash, leak or over-read; an accepted frame's payload lies
 * inside the input and matches its header; the frame packs again
 * (wire_frame_pack, which recomputes length and checksum) and the result
 * unpacks to the same payload. */
#include <string.h>

#include "fuzz.h"
#include "tandem_err.h"
#include "wire.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_init_logs();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct wire_frame f;
    int rc = wire_frame_unpack(data, size, &f);
    if (rc != 0) {
        FUZZ_CHECK(f.env == NULL && f.payload == NULL && f.payload_len == 0 && f.msg == NULL);
        wire_frame_fini(&f);
        return 0;
    }
    FUZZ_CHECK(f.env != NULL && f.msg == NULL);
    FUZZ_CHECK(f.payload_len <= size);
    if (f.payload_len > 0) {
        FUZZ_CHECK(f.payload >= data && f.payload + f.payload_len == data + size);
        FUZZ_CHECK(f.env->kind == TANDEM__ENVELOPE__KIND__KV_FRAME);
    }
    if (f.env->kind == TANDEM__ENVELOPE__KIND__KV_FRAME) {
        FUZZ_CHECK(f.env->kv_frame != NULL && f.env->kv_frame->payload_length == f.payload_len);
    }

    size_t need = 0;
    FUZZ_CHECK(wire_frame_size(f.env, f.payload_len, &need) == 0);
    uint8_t *buf = malloc(need ? need : 1);
    FUZZ_CHECK(buf != NULL);
    size_t len = 0;
    rc = wire_frame_pack(f.env, f.payload, f.payload_len, buf, need, &len);
    FUZZ_CHECK(rc == 0 && len <= need);

    struct wire_frame g;
    rc = wire_frame_unpack(buf, len, &g);
    FUZZ_CHECK(rc == 0 && g.env->kind == f.env->kind && g.env->request_id == f.env->request_id);
    FUZZ_CHECK(g.payload_len == f.payload_len);
    FUZZ_CHECK(f.payload_len == 0 || memcmp(g.payload, f.payload, f.payload_len) == 0);

    wire_frame_fini(&g);
    wire_frame_fini(&f);
    free(buf);
    return 0;
}
