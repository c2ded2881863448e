/* Control-link envelopes: wire_unpack on any bytes (common/wire.h), and
 * wire_unpack_item on every item of a BATCH.
 *
 * Properties: no crash, leak or over-read; an envelope unpack accepts packs
 * (wire_pack runs the same validator) into at most WIRE_MAX_MSG_BYTES, and
 * the packed bytes unpack again and pack to the same bytes; an item either
 * decodes to a valid envelope that is not a batch or fails with nothing
 * returned. */
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
    Tandem__Envelope *env = NULL;
    int rc = wire_unpack(data, size, &env);
    if (rc != 0) {
        FUZZ_CHECK(env == NULL);
        FUZZ_CHECK(rc < 0 && wire_error_detail() != NULL);
        return 0;
    }
    FUZZ_CHECK(env != NULL && env->version == WIRE_VERSION);
    FUZZ_CHECK(wire_validate(env) == 0);
    FUZZ_CHECK(strcmp(wire_kind_name(env->kind), "unknown") != 0);

    size_t cap = protobuf_c_message_get_packed_size(&env->base);
    uint8_t *a = malloc(cap ? cap : 1), *b = malloc(cap ? cap : 1);
    FUZZ_CHECK(a != NULL && b != NULL);
    size_t alen = 0, blen = 0;
    rc = wire_pack(env, a, cap, &alen);
    FUZZ_CHECK(rc == 0 && alen == cap && alen <= WIRE_MAX_MSG_BYTES);

    Tandem__Envelope *again = NULL;
    rc = wire_unpack(a, alen, &again);
    FUZZ_CHECK(rc == 0);
    rc = wire_pack(again, b, cap, &blen);
    FUZZ_CHECK(rc == 0 && blen == alen && memcmp(a, b, alen) == 0);

    wire_free(again);
    for (size_t i = 0; env->kind == TANDEM__ENVELOPE__KIND__BATCH && i < env->batch->n_envelopes;
         i++) {
        Tandem__Envelope *item = NULL;
        rc = wire_unpack_item(env, i, &item);
        if (rc != 0) {
            FUZZ_CHECK(item == NULL && rc < 0);
            continue;
        }
        FUZZ_CHECK(item != NULL && item->kind != TANDEM__ENVELOPE__KIND__BATCH);
        FUZZ_CHECK(wire_validate(item) == 0);
        wire_free(item);
    }
    wire_free(env);
    free(a);
    free(b);
    return 0;
}
