/*
 * ctl_chat: sessions for the chat API, the effects half of parent-token-v1.
 * ctl_chat_begin() reads a chat request's session headers, asks ctl_session
 * (the pure contract) whether the request continues its session, and
 * rewrites the request to continue the parked state (only the delta is fed)
 * or to start fresh; ctl_chat_end() commits or retires the session after the
 * generation. A parked chat is a dirty ctl_vm entry spilled to the store
 * (ctl_chat_spill) when evicted. Never parses a request body or shapes a
 * response: ctl_openai does both and calls in here.
 */
#ifndef CTL_CHAT_H
#define CTL_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "ctl_app.h"
#include "ctl_openai.h"
#include "wk_err.h"

typedef struct ctl_chat_turn ctl_chat_turn;

/*
 * Session glue for a chat request: reads the parent-token-v1 headers, and
 * when the request belongs to a session, looks its binding up, validates
 * it, and rewrites r to continue the parked state (only the delta is fed)
 * or to start fresh, keeping the slot afterwards. Returns false after
 * sending an error (bad headers 400, session busy 409). *turn (maybe NULL)
 * must be passed to ctl_chat_end() after ctl_openai_generate().
 */
WK_MUST_CHECK bool ctl_chat_begin(ctl_http_req *req, ctl_app *app, ctl_openai_req *r,
                                  ctl_chat_turn **turn);

/* Commits or retires the session after the generation; frees turn. NULL-safe. */
void ctl_chat_end(ctl_chat_turn *turn);

/*
 * The set of chat sessions with a turn in progress (a second turn of the same
 * session answers 409 while the first runs): one per ctl_app, created before
 * the HTTP server starts and freed after it stopped. Thread-safe.
 * ctl_chat_active_new() returns WK_ENOMEM.
 */
WK_MUST_CHECK wk_err ctl_chat_active_new(ctl_chat_active **out);
void ctl_chat_active_free(ctl_chat_active *a); /* NULL-safe */

/* Declares the session metric families. */
WK_MUST_CHECK wk_err ctl_chat_metrics_declare(ctl_metrics *m);

/* The vm spill function for parked sessions (arg: the app). */
WK_MUST_CHECK wk_err ctl_chat_spill(void *arg, const char *key, const void *bytes, size_t len,
                                    wk_diag *d);

#endif /* CTL_CHAT_H */
