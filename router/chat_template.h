/* Chat template: turns the messages of a /v1/chat/completions request into
 * the prompt text the router tokenizes (with BOS, engine/tokenizer.h).
 *
 * One documented template serves every model Tandem runs (the embedded
 * byte-level `tiny` model and llama2.c checkpoints, neither of which ships a
 * template of its own). It is the role-tag text form of Zephyr/TinyLlama
 * chat, without special tokens, since our tokenizers do not parse special
 * tokens out of text:
 *
 *     <|system|>\n{content}\n<|user|>\n{content}\n<|assistant|>\n
 *
 * Each message is "<|" role "|>\n" content "\n", in order; with
 * add_generation_prompt the text ends with "<|assistant|>\n", the turn the
 * model completes. "developer" messages (OpenAI's newer name for system
 * messages) render as <|system|>. Content is inserted verbatim: a message
 * that contains "<|user|>" is not escaped (the same holds for every text
 * template, Jinja ones included). See docs/api.md "Chat template".
 *
 * Threading: pure functions, thread-safe. */
#ifndef TANDEM_CHAT_TEMPLATE_H
#define TANDEM_CHAT_TEMPLATE_H

#include <stddef.h>

enum chat_role {
    CHAT_ROLE_SYSTEM = 1,
    CHAT_ROLE_DEVELOPER, /* rendered as system */
    CHAT_ROLE_USER,
    CHAT_ROLE_ASSISTANT,
    CHAT_ROLE_TOOL,
};

/* One message. content need not be NUL-terminated; it is not copied. */
struct chat_message {
    enum chat_role role;
    const char *content; /* (content_len) bytes; may be NULL when content_len == 0 */
    size_t content_len;
};

/* "system", "developer", "user", "assistant" or "tool"; "?" for any other
 * value. The returned string is static. */
const char *chat_role_name(enum chat_role role);

/* Parses one of the names above (exact, case-sensitive, as OpenAI). Returns
 * 0, or TANDEM_EINVAL (then *out is untouched). */
int chat_role_parse(const char *name, enum chat_role *out);

/* Exact length in bytes of the rendered text (without a NUL). */
size_t chat_template_length(const struct chat_message *msgs, int n, int add_generation_prompt);

/* Renders msgs[0..n) (n >= 0) into a new NUL-terminated string. On success
 * *out is owned by the caller (free()) and *out_len (if not NULL) is its
 * length. Returns 0, TANDEM_EINVAL (NULL out, n < 0, or a message with an
 * unknown role), or TANDEM_ENOMEM (*out then untouched). */
int chat_template_render(const struct chat_message *msgs, int n, int add_generation_prompt,
                         char **out, size_t *out_len);

#endif
