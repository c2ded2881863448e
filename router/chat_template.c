/* Chat template (see chat_template.h and docs/api.md). */
#include "chat_template.h"

#include <stdlib.h>
#include <string.h>

#include "tandem_err.h"

static const char GEN_PROMPT[] = "<|assistant|>\n";

/* The tag a role renders as: "<|" name "|>\n". */
static const char *role_tag(enum chat_role role)
{
    switch (role) {
    case CHAT_ROLE_SYSTEM:
    case CHAT_ROLE_DEVELOPER:
        return "<|system|>\n";
    case CHAT_ROLE_USER:
        return "<|user|>\n";
    case CHAT_ROLE_ASSISTANT:
        return "<|assistant|>\n";
    case CHAT_ROLE_TOOL:
        return "<|tool|>\n";
    }
    return NULL;
}

const char *chat_role_name(enum chat_role role)
{
    switch (role) {
    case CHAT_ROLE_SYSTEM:
        return "system";
    case CHAT_ROLE_DEVELOPER:
        return "developer";
    case CHAT_ROLE_USER:
        return "user";
    case CHAT_ROLE_ASSISTANT:
        return "assistant";
    case CHAT_ROLE_TOOL:
        return "tool";
    }
    return "?";
}

int chat_role_parse(const char *name, enum chat_role *out)
{
    static const enum chat_role roles[] = {CHAT_ROLE_SYSTEM, CHAT_ROLE_DEVELOPER, CHAT_ROLE_USER,
                                           CHAT_ROLE_ASSISTANT, CHAT_ROLE_TOOL};
    if (name == NULL || out == NULL)
        return TANDEM_EINVAL;
    for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++) {
        if (strcmp(name, chat_role_name(roles[i])) == 0) {
            *out = roles[i];
            return 0;
        }
    }
    return TANDEM_EINVAL;
}

size_t chat_template_length(const struct chat_message *msgs, int n, int add_generation_prompt)
{
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        const char *tag = role_tag(msgs[i].role);
        len += (tag ? strlen(tag) : 0) + msgs[i].content_len + 1;
    }
    if (add_generation_prompt)
        len += sizeof(GEN_PROMPT) - 1;
    return len;
}

int chat_template_render(const struct chat_message *msgs, int n, int add_generation_prompt,
                         char **out, size_t *out_len)
{
    if (out == NULL || n < 0 || (n > 0 && msgs == NULL))
        return TANDEM_EINVAL;
    for (int i = 0; i < n; i++) {
        if (role_tag(msgs[i].role) == NULL || (msgs[i].content == NULL && msgs[i].content_len))
            return TANDEM_EINVAL;
    }
    size_t len = chat_template_length(msgs, n, add_generation_prompt);
    char *s = malloc(len + 1);
    if (s == NULL)
        return TANDEM_ENOMEM;
    char *p = s;
    for (int i = 0; i < n; i++) {
        const char *tag = role_tag(msgs[i].role);
        size_t tl = strlen(tag);
        memcpy(p, tag, tl);
        p += tl;
        if (msgs[i].content_len) {
            memcpy(p, msgs[i].content, msgs[i].content_len);
            p += msgs[i].content_len;
        }
        *p++ = '\n';
    }
    if (add_generation_prompt) {
        memcpy(p, GEN_PROMPT, sizeof(GEN_PROMPT) - 1);
        p += sizeof(GEN_PROMPT) - 1;
    }
    *p = '\0';
    *out = s;
    if (out_len)
        *out_len = len;
    return 0;
}
