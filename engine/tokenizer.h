/* Tokenizers: text <-> token ids, shared by the workers and the router.
 *
 * Two kinds behind one API:
 *   - byte-level (TOK_KIND_BYTES, the embedded default of the `tiny` model):
 *     ids 0, 1, 2 are <unk>, <s> (BOS), </s> (EOS); byte b is id b + 3; ids
 *     259 .. vocab_size-1 are unused and decode to nothing. encode = optional
 *     BOS then one id per byte, no dummy prefix.
 *   - llama2.c tokenizer.bin (TOK_KIND_LLAMA2C): the SentencePiece-style BPE
 *     of karpathy/llama2.c run.c. encode = optional BOS, a " " dummy prefix
 *     when the text is non-empty, one token per UTF-8 codepoint found in the
 *     vocabulary (byte fallback to id byte + 3 otherwise), then repeatedly the
 *     adjacent pair whose concatenation is in the vocabulary with the highest
 *     score is merged, the leftmost on ties. Same ids as llama2.c, computed in
 *     O(n log n) with a heap over adjacent pairs instead of its O(n^2) scan.
 *     decode strips the leading space of the token after BOS and turns
 *     <0xXX> pieces into the raw byte.
 *
 * Where llama2.c's behaviour is undefined or crashes, this module chooses
 * (see docs/engine.md "## tokenizer"): a NUL byte in the text is encoded like
 * any other byte (llama2.c stops at it); duplicate vocabulary strings resolve
 * to the lowest id; a vocabulary without " " uses the byte token 0x20 + 3 as
 * the dummy prefix; only a piece that is exactly "<0x" two hex digits ">"
 * decodes to a raw byte; the control ids 0, 1, 2 decode to no text.
 *
 * Threading: a tokenizer is immutable after creation; every const function
 * may be called from any number of threads at once. */
#ifndef TANDEM_TOKENIZER_H
#define TANDEM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#define TOK_UNK       0u
#define TOK_BOS       1u
#define TOK_EOS       2u
#define TOK_BYTE_BASE 3u         /* byte b is id b + TOK_BYTE_BASE in both kinds */
#define TOK_NO_PREV   UINT32_MAX /* "no previous token" for the decode functions */

#define TOK_BYTES_VOCAB 512             /* vocabulary of tok_create_bytes() */
#define TOK_MIN_VOCAB   259             /* 3 specials + 256 bytes */
#define TOK_MAX_VOCAB   (1 << 21)       /* largest vocab_size accepted */
#define TOK_MAX_PIECE   1024            /* largest tokenizer.bin entry, bytes */
#define TOK_MAX_FILE    (1u << 30)      /* largest tokenizer.bin file, bytes */
#define TOK_MAX_TEXT    (INT32_MAX - 2) /* longest text tok_encode accepts, bytes */

enum tok_kind { TOK_KIND_BYTES = 1, TOK_KIND_LLAMA2C = 2 };

struct tokenizer;

/* Creates the byte-level tokenizer with TOK_BYTES_VOCAB ids. On success *out
 * is owned by the caller (free with tok_destroy). Returns 0 or TANDEM_ENOMEM.
 * Any thread. */
int tok_create_bytes(struct tokenizer **out);

/* Same with a vocabulary of vocab_size ids, in [TOK_MIN_VOCAB, TOK_MAX_VOCAB]
 * (TANDEM_EINVAL otherwise); ids >= 259 decode to nothing. */
int tok_create_bytes_n(struct tokenizer **out, int vocab_size);

/* Loads a llama2.c tokenizer.bin: int32 max_token_length, then vocab_size
 * entries of (float32 score, int32 len, len bytes), little-endian. The file
 * does not say how many entries it holds: vocab_size comes from the model and
 * must be in [TOK_MIN_VOCAB, TOK_MAX_VOCAB]. Bytes after the last entry are
 * ignored with a warning. On success *out is owned by the caller (tok_destroy);
 * on failure *out is untouched and an error naming the entry and file offset
 * is logged. Returns 0, TANDEM_EINVAL (bad vocab_size or NULL argument),
 * TANDEM_ENOENT / TANDEM_EIO (cannot read path), TANDEM_ETOOBIG (file over
 * TOK_MAX_FILE), TANDEM_ETRUNCATED (file ends inside the header or an entry),
 * TANDEM_EFORMAT (max_token_length outside [1, TOK_MAX_PIECE], an entry length
 * negative or over max_token_length) or TANDEM_ENOMEM. Any thread. */
int tok_load(struct tokenizer **out, const char *path, int vocab_size);

/* Same as tok_load from the size bytes at data (not retained: the tokenizer
 * copies what it needs). name is only used in log messages (may be NULL). */
int tok_load_mem(struct tokenizer **out, const void *data, size_t size, int vocab_size,
                 const char *name);

/* Frees t and everything it owns. NULL is a no-op. No other thread may be
 * using t. */
void tok_destroy(struct tokenizer *t);

enum tok_kind tok_kind(const struct tokenizer *t);
int tok_vocab_size(const struct tokenizer *t);
int tok_bos(const struct tokenizer *t); /* TOK_BOS for both kinds */
int tok_eos(const struct tokenizer *t); /* TOK_EOS for both kinds */

/* An output size that always suffices for encoding len bytes of text: one id
 * per byte plus BOS plus the dummy prefix. */
#define TOK_ENCODE_BOUND(len) ((size_t)(len) + 2)

/* Encodes text[0..len) (any bytes, NUL included; need not be valid UTF-8)
 * into out[0..max_out), with BOS first when add_bos is non-zero. Returns the
 * number of ids written, TANDEM_ETOOBIG when they do not fit in max_out (out
 * then holds nothing useful) or len > TOK_MAX_TEXT, TANDEM_EINVAL on NULL
 * arguments or max_out < 0, TANDEM_ENOMEM when the scratch space (about 32
 * bytes per input byte for the llama2.c kind) cannot be allocated. The caller
 * owns out. Thread-safe. */
int tok_encode(const struct tokenizer *t, const char *text, size_t len, int add_bos, uint32_t *out,
               int max_out);

/* The raw vocabulary string of id (for the byte kind: the byte itself for
 * ids 3..258, "" otherwise). *piece points into t (valid until tok_destroy)
 * and is not NUL-terminated. Returns 0 or TANDEM_ERANGE. Thread-safe. */
int tok_piece(const struct tokenizer *t, uint32_t id, const char **piece, size_t *len);

/* The text of token id when it follows token prev (TOK_NO_PREV at the start):
 * llama2.c's decode(prev, id). *piece points into t (valid until tok_destroy),
 * is not NUL-terminated and may be a lone byte of a multi-byte UTF-8 character
 * (feed it through struct tok_utf8 for streaming). Returns 0 or TANDEM_ERANGE
 * when id >= vocab size. Thread-safe. */
int tok_decode_piece(const struct tokenizer *t, uint32_t prev, uint32_t id, const char **piece,
                     size_t *len);

/* Decodes ids[0..n) (the first with prev = TOK_NO_PREV) into out as raw bytes
 * followed by a NUL. Returns the number of bytes written before the NUL, or
 * TANDEM_ETOOBIG when they and the NUL do not fit in cap, TANDEM_ERANGE on an
 * id outside the vocabulary, TANDEM_EINVAL on bad arguments. With out == NULL
 * and cap == 0 it returns the length the decode needs (without the NUL). The
 * bytes are not validated as UTF-8. Thread-safe. */
int tok_decode(const struct tokenizer *t, const uint32_t *ids, int n, char *out, size_t cap);

/* Streaming UTF-8 repair for SSE: tokens may end in the middle of a
 * character (byte-fallback tokens, the byte-level kind), but each chunk sent
 * to a client must be valid UTF-8 on its own. tok_utf8_push() emits every
 * complete, valid character of (held-back bytes + input) and holds back an
 * incomplete sequence at the end (at most 3 bytes); invalid bytes become
 * U+FFFD (EF BF BD), one per maximal ill-formed subpart as Unicode
 * recommends. tok_utf8_flush() ends the stream: held-back bytes become one
 * U+FFFD. One struct per stream, owned by the caller (embed it); not
 * thread-safe, but independent streams are. */
struct tok_utf8 {
    unsigned char held[4];
    unsigned nheld;
};

/* Output space that always suffices for pushing len bytes. */
#define TOK_UTF8_OUT_MAX(len) (3 * (size_t)(len) + 9)

void tok_utf8_init(struct tok_utf8 *s);

/* Returns the number of bytes written to out (valid UTF-8, not
 * NUL-terminated), or TANDEM_ETOOBIG when cap < TOK_UTF8_OUT_MAX(len) (the
 * state is then unchanged). */
int tok_utf8_push(struct tok_utf8 *s, const char *in, size_t len, char *out, size_t cap);

/* Writes U+FFFD when bytes are held back, then resets s. Returns the number of
 * bytes written (0 or 3), or TANDEM_ETOOBIG when cap < 3 and bytes are held. */
int tok_utf8_flush(struct tok_utf8 *s, char *out, size_t cap);

/* tok_decode_piece(prev, id) pushed through s: the chunk to stream for one
 * generated token. Returns bytes written to out (possibly 0), TANDEM_ERANGE,
 * or TANDEM_ETOOBIG when cap < TOK_UTF8_OUT_MAX(TOK_MAX_PIECE). */
int tok_stream_token(const struct tokenizer *t, struct tok_utf8 *s, uint32_t prev, uint32_t id,
                     char *out, size_t cap);

#endif
