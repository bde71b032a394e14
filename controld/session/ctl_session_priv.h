/*
 * ctl_session_priv: the binding's layout and two helpers, for
 * tests/unit/test_ctl_session.c only (to damage a binding on purpose and to
 * test the rules directly). Production code uses ctl_session.h and never
 * reaches into a binding.
 */
#ifndef CTL_SESSION_PRIV_H
#define CTL_SESSION_PRIV_H

#include "ctl_session.h"

/* Which contract made a binding (encoded as a uint32). */
typedef enum ctl_session_contract {
    CTL_SESSION_CONTRACT_PARENT_TOKEN_V1 = 1, /* made by a parent-token-v1 request */
    CTL_SESSION_CONTRACT_EXACT_PREFIX = 2,    /* made by a chat-id request without it */
} ctl_session_contract;

/* One canonical input message. */
typedef struct ctl_session_msg {
    char *role;    /* "system", "user" or "assistant", malloc'd */
    char *content; /* cleaned content, malloc'd, NUL-terminated */
    size_t len;    /* bytes of content */
} ctl_session_msg;

struct ctl_session_binding {
    uint32_t contract;                       /* ctl_session_contract */
    ctl_session_msg *msgs;                   /* canonical input messages, malloc'd */
    size_t n_msgs;                           /* entries in msgs */
    int32_t *prompt;                         /* rendered prompt ids of the turn, malloc'd */
    size_t n_prompt;                         /* entries in prompt */
    int32_t *retained;                       /* ids the parked state consumed, malloc'd */
    size_t n_retained;                       /* entries in retained */
    char retained_digest[WK_SHA256_HEX_LEN]; /* retained_token_digest, hex */
    bool has_meta;                           /* last_assistant_id/last_user_id are set */
    char *last_assistant_id;                 /* malloc'd, NULL without metadata */
    char *last_user_id;                      /* malloc'd, NULL without metadata */
    char **used;                             /* message ids used so far, oldest first */
    size_t n_used;                           /* entries in used */
    bool has_history;                        /* visible and history_digest are set */
    char *visible;                           /* text sent to the client, malloc'd, or NULL */
    size_t visible_len;                      /* bytes of visible */
    char history_digest[WK_SHA256_HEX_LEN];  /* visible_parent_history_digest, hex or "" */
    uint8_t *ref;                            /* caller's opaque ref, malloc'd, or NULL */
    size_t ref_len;                          /* bytes of ref */
};

/*
 * The hidden-terminal prefix rule: true when retained, with every end-of-text
 * id skipped, is a prefix of prompt; then *off is the number of prompt ids it
 * covers (the delta starts there).
 */
bool ctl_session_prefix_match(const int32_t *retained, size_t n_retained, const int32_t *prompt,
                              size_t n_prompt, size_t *off);

#endif /* CTL_SESSION_PRIV_H */
