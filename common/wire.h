/* Tandem wire protocol: pack, unpack and validate the messages of
 * proto/tandem.proto, build and parse KV frames, and send/receive them on NNG
 * sockets. docs/protocol.md describes the protocol; this is its C contract.
 *
 * Two framings, chosen by the link (never by sniffing the bytes):
 *   control link (PAIR0, router <-> worker): NNG body = one packed Envelope,
 *     which may be a BATCH of packed Envelopes (wire_unpack_item).
 *   data link (PUSH0 -> PULL0, worker -> worker): NNG body = a frame,
 *     [u32 little-endian n][n bytes: packed Envelope][payload]
 *   where the payload is the raw KV bytes of a KV_FRAME and empty for every
 *   other kind. KV_FRAME is refused on a control link, BATCH on a data link.
 *
 * Every unpack validates: protocol version (read from the raw bytes before
 * anything else is decoded, so a future layout still gets TANDEM_EVERSION),
 * known kind, body present and matching the kind, request id scope, required
 * fields, every count and length within its WIRE_MAX_* limit, and the heap an
 * unpack may use (WIRE_MAX_DECODED_BYTES, against allocation amplification).
 * Packing runs the same validator, so nothing is sent that a peer would refuse.
 *
 * Error codes, for pack and unpack alike:
 *   TANDEM_EVERSION    envelope version is not WIRE_VERSION (or is missing)
 *   TANDEM_ETOOBIG     a count, length or size above its limit; buffer too small
 *   TANDEM_ETRUNCATED  input ends early (empty input, cut frame or payload)
 *   TANDEM_EPROTO      malformed protobuf, unknown kind, kind/body mismatch,
 *                      missing required field, request id in the wrong scope,
 *                      parallel arrays of different lengths, KV_FRAME on control
 *   TANDEM_ERANGE      a value outside its domain (unknown enum, zero where
 *                      positive is required, NaN or out-of-range sampling value)
 *   TANDEM_ECHECKSUM   KV payload does not match the header's XXH3-64
 *   TANDEM_ENOMEM      allocation failed
 *   TANDEM_EINVAL      bad arguments (NULL pointers, payload for a non-KV kind)
 * After a failure, wire_error_detail() says which field and why.
 *
 * Threading: every function is thread-safe on distinct arguments; the detail
 * string is per thread. NNG sockets may be shared as NNG allows. */
#ifndef TANDEM_WIRE_H
#define TANDEM_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>

#include "tandem.pb-c.h"

/* Protocol version spoken and accepted. Bump on any change an old peer would
 * misread; see docs/protocol.md "Versioning". */
#define WIRE_VERSION 1

/* Limits. Each is checked on pack and on unpack; limit + 1 is TANDEM_ETOOBIG. */
#define WIRE_MAX_MSG_BYTES        (2u << 20)  /* one packed Envelope */
#define WIRE_MAX_DECODED_BYTES    (8u << 20)  /* heap used to unpack one Envelope */
#define WIRE_MAX_TOKENS           131072u     /* prompt; prompt + generated; max_tokens */
#define WIRE_MAX_CHUNK_TOKENS     4096u       /* tokens per TokenChunk / PromptLogprobs */
#define WIRE_MAX_STOP_IDS         64u         /* SamplingParams.stop_token_ids */
#define WIRE_MAX_LOGPROBS         5u          /* top logprobs per position */
#define WIRE_MAX_NAME_BYTES       128u        /* worker id, model name */
#define WIRE_MAX_ADDR_BYTES       256u        /* NNG URLs, host:port */
#define WIRE_MAX_TEXT_BYTES       1024u       /* Error.message, Busy.detail */
#define WIRE_MAX_EVENTS           1024u       /* KvEvents.events */
#define WIRE_MAX_BATCH            1024u       /* Batch.envelopes */
#define WIRE_MAX_EVENT_HASHES     65536u      /* block hashes in one KvEvents, all events */
#define WIRE_MAX_BLOCK_TOKENS     1024u       /* block size (= BH_MAX_BLOCK_SIZE) */
#define WIRE_MAX_LAYERS           1024u       /* first_layer + layer_count */
#define WIRE_MAX_KV_PAYLOAD_BYTES (64u << 20) /* raw KV bytes in one frame */
/* Cluster secret fields (common/auth.h): Auth.nonce, and every proof or tag
 * (Auth.proof, WorkerHello.auth_proof, Envelope.auth_tag), empty or sized so. */
#define WIRE_AUTH_NONCE_MIN     16u
#define WIRE_AUTH_NONCE_MAX     64u
#define WIRE_AUTH_TAG_BYTES     32u
#define WIRE_FRAME_PREFIX_BYTES 4u /* the u32 envelope length */
#define WIRE_MAX_FRAME_BYTES                                                                       \
    ((size_t)WIRE_FRAME_PREFIX_BYTES + WIRE_MAX_MSG_BYTES + WIRE_MAX_KV_PAYLOAD_BYTES)

/* The two kinds of NNG link (docs/protocol.md "Sockets"). */
enum wire_link {
    WIRE_LINK_CONTROL = 0, /* PAIR0, bare envelopes, receive limit WIRE_MAX_MSG_BYTES */
    WIRE_LINK_DATA,        /* PUSH0/PULL0, frames, receive limit WIRE_MAX_FRAME_BYTES */
};

/* A received or parsed frame. env is always set on success; payload points
 * into the received message (or the caller's buffer) — zero copy — and has
 * no alignment guarantee: memcpy from it. payload_len is 0 for kinds other
 * than KV_FRAME. Release with wire_frame_fini. */
struct wire_frame {
    Tandem__Envelope *env;  /* owned, decoded and validated */
    const uint8_t *payload; /* (payload_len) bytes inside msg or the caller's buffer */
    size_t payload_len;
    nng_msg *msg; /* owned when the frame came from NNG, else NULL */
};

/* ---- Envelopes ---------------------------------------------------------- */

/* Initialises *env as a version WIRE_VERSION envelope of the given kind and
 * request id, with body (a pointer to the kind's message, e.g. a
 * Tandem__DecodeJob * for DECODE_JOB) set in the oneof. env borrows body.
 * Returns 0, TANDEM_EPROTO for an unknown kind, TANDEM_EINVAL for NULL. */
int wire_env_init(Tandem__Envelope *env, Tandem__Envelope__Kind kind, uint64_t request_id,
                  void *body);

/* "hello", "decode_job", ... or "unknown". Pure. */
const char *wire_kind_name(int kind);

/* Checks env against everything unpack checks (see the top of this file),
 * except the link rules (KV_FRAME only on a data link, BATCH only
 * on a control link). 0 or a TANDEM_E* code. */
int wire_validate(const Tandem__Envelope *env);

/* Validates env and packs it into buf[0..cap). On success *len is the packed
 * size. TANDEM_ETOOBIG if cap is too small (nothing useful is written).
 * KV_FRAME is refused (TANDEM_EPROTO): use wire_frame_pack. */
int wire_pack(const Tandem__Envelope *env, void *buf, size_t cap, size_t *len);

/* As wire_pack, into a new nng_msg whose body is exactly the envelope.
 * On success *out is the caller's (send it or nng_msg_free it). */
int wire_pack_msg(const Tandem__Envelope *env, nng_msg **out);

/* Decodes and validates one control-link envelope from buf[0..len). buf is
 * not retained. On success *out is the caller's: free with wire_free. On
 * failure *out is NULL and nothing is leaked. */
int wire_unpack(const void *buf, size_t len, Tandem__Envelope **out);

/* Decodes and validates item i of a BATCH envelope (from wire_unpack) as
 * wire_unpack would a message of its own; a BATCH inside a batch is
 * TANDEM_EPROTO. A receiver handles a batch's items in order, each as if it
 * had come alone, and refuses a bad item alone. *out as wire_unpack. */
int wire_unpack_item(const Tandem__Envelope *batch, size_t i, Tandem__Envelope **out);

/* Packs msgs[0..n) (1..WIRE_MAX_BATCH control-link messages from
 * wire_pack_msg, left the caller's) into one new BATCH message, *out the
 * caller's. The items are not validated again. TANDEM_ETOOBIG when n or the
 * packed size is over its limit. */
int wire_batch_pack_msg(nng_msg *const *msgs, size_t n, nng_msg **out);

/* Frees an envelope from wire_unpack / wire_recv (NULL is fine). Only for
 * decoded envelopes: ones built by the caller are the caller's business. */
void wire_free(Tandem__Envelope *env);

/* Message of the last failure of a wire_* call on this thread, e.g.
 * "decode_job.prompt_token_ids: 131073 > 131072". "" if none yet. */
const char *wire_error_detail(void);

/* ---- Frames (data link) ------------------------------------------------- */

/* Size of the frame for env plus payload_len payload bytes, into *size, to
 * size a buffer for wire_frame_pack. Exact, except that a KV_FRAME whose
 * checksum happens to be 0 (p = 2^-64) packs 9 bytes shorter. Does not
 * validate. 0 or TANDEM_EINVAL. */
int wire_frame_size(const Tandem__Envelope *env, size_t payload_len, size_t *size);

/* Builds a frame into buf[0..cap): prefix, envelope, then payload copied
 * once from the caller's memory. For KV_FRAME, the header's payload_length
 * and checksum are computed here (XXH3-64 of the payload) and the caller's
 * header is left untouched; for any other kind payload_len must be 0
 * (TANDEM_EINVAL). *len is the frame size. TANDEM_ETOOBIG if cap is short. */
int wire_frame_pack(const Tandem__Envelope *env, const void *payload, size_t payload_len, void *buf,
                    size_t cap, size_t *len);

/* As wire_frame_pack, into a new nng_msg of exactly the frame's size (the
 * payload is copied once, straight into the message). *out is the caller's. */
int wire_frame_pack_msg(const Tandem__Envelope *env, const void *payload, size_t payload_len,
                        nng_msg **out);

/* Computes the cluster-secret tag of env[0..len), a packed envelope
 * (common/auth.h, auth_frame_tag). */
typedef void (*wire_seal_fn)(void *arg, const void *env, size_t len,
                             uint8_t tag[WIRE_AUTH_TAG_BYTES]);

/* As wire_frame_pack_msg, and the envelope also carries auth_tag = seal(the
 * envelope packed without it, KV payload length and checksum filled in);
 * auth_tag is packed last, so a receiver checks the bytes before it
 * (auth_frame_check). env's own auth_tag is ignored. */
int wire_frame_pack_msg_sealed(const Tandem__Envelope *env, const void *payload, size_t payload_len,
                               wire_seal_fn seal, void *arg, nng_msg **out);

/* Parses a frame in buf[0..len): prefix bounds, envelope (as wire_unpack,
 * KV_FRAME allowed), payload length == header.payload_length == remaining
 * bytes (fewer: TANDEM_ETRUNCATED, more: TANDEM_EPROTO), checksum
 * (TANDEM_ECHECKSUM). out->payload points into buf, which must outlive the
 * frame; out->msg is NULL. On failure *out is zeroed and nothing is leaked. */
int wire_frame_unpack(const void *buf, size_t len, struct wire_frame *out);

/* As wire_frame_unpack on msg's body. On success the frame owns msg
 * (released by wire_frame_fini); on failure msg stays the caller's. */
int wire_frame_unpack_msg(nng_msg *msg, struct wire_frame *out);

/* Frees the envelope and the message of a frame and zeroes it. Idempotent. */
void wire_frame_fini(struct wire_frame *f);

/* ---- NNG ---------------------------------------------------------------- */

/* Maps an NNG return code: 0 -> 0; NNG_ETIMEDOUT and NNG_EAGAIN (nothing
 * ready on a non-blocking call) -> TANDEM_ETIMEOUT; NNG_ECLOSED,
 * NNG_ECONNSHUT, NNG_ECONNRESET, NNG_ECONNABORTED -> TANDEM_ECLOSED;
 * NNG_ENOMEM -> TANDEM_ENOMEM; NNG_EMSGSIZE -> TANDEM_ETOOBIG; anything else
 * -> TANDEM_ENNG. The NNG text goes to wire_error_detail(). */
int wire_nng_err(int nng_rv);

/* Sets the socket's receive size limit for its link kind, so NNG drops
 * oversized messages before they are buffered (NNG's default, 1 MiB, is
 * too small for a data link). Call before dialing/listening. */
int wire_socket_setup(nng_socket s, enum wire_link link);

/* Sends msg with nng_sendmsg(s, msg, flags). Always consumes msg: NNG takes
 * it on success, and this frees it on failure. Returns 0 or a wire_nng_err
 * code. Thread: any. */
int wire_sendmsg(nng_socket s, nng_msg *msg, int flags);

/* Hands NNG a copy of msg, allocated here, with nng_sendmsg(s, copy, flags):
 * 0 (NNG owns the copy; msg is freed) or the NNG error (msg stays the
 * caller's; NNG_EAGAIN with NNG_FLAG_NONBLOCK: try later). Why a copy: NNG
 * 1.5.2 can lose a message it owns (a pipe closed while the message sits in
 * the transport's send aio frees neither: nanomsg/nng#625, #1713). Only a
 * message allocated in this one frame can be told apart from one Tandem
 * leaked, so tests/sanitizers/lsan.supp names this function and no sender.
 * Used on the control links (small messages: one allocation and a memcpy).
 * Thread: any. */
int wire_handoff(nng_socket s, nng_msg *msg, int flags);

/* wire_sendmsg through wire_handoff: always consumes msg. */
int wire_sendmsg_copy(nng_socket s, nng_msg *msg, int flags);

/* Packs env (wire_pack_msg) and sends it on a control link. env stays the
 * caller's. flags as nng_sendmsg (0 or NNG_FLAG_NONBLOCK). */
int wire_send(nng_socket s, const Tandem__Envelope *env, int flags);

/* Builds a frame (wire_frame_pack_msg) and sends it on a data link. */
int wire_frame_send(nng_socket s, const Tandem__Envelope *env, const void *payload,
                    size_t payload_len, int flags);

/* Receives one control-link message and decodes it (wire_unpack). On
 * success *out is the caller's (wire_free). A message that fails to decode
 * is dropped and its error returned; the socket stays usable. */
int wire_recv(nng_socket s, int flags, Tandem__Envelope **out);

/* Receives one data-link frame (zero copy: out owns the NNG message).
 * On success release with wire_frame_fini; on failure the message is freed. */
int wire_frame_recv(nng_socket s, int flags, struct wire_frame *out);

#endif
