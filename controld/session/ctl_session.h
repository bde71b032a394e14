/*
 * ctl_session: the parent-token-v1 contract (docs/OPEN_WEBUI.md) as a pure
 * decision module. For an incoming chat request it parses the contract
 * headers, names the session, decides whether the request continues a parked
 * session exactly (and which delta tokens to prefill) or starts fresh (and
 * why), and after the turn builds the new binding, which it encodes to and
 * decodes from opaque bytes for the store.
 *
 * It never does I/O: no HTTP, NNG, LMDB, logging, clocks or globals. The
 * caller (the OpenAI handler and the scheduler) looks the binding up, parks
 * and retires slots, and increments the counters from the result. Every
 * function is reentrant; a binding is immutable once built, except through
 * ctl_session_binding_set_ref(), so it may be read by many threads at once
 * when nobody sets its ref.
 *
 * Wire rules kept byte-compatible with the original system:
 * - Headers (names case-insensitive, first occurrence wins, values stripped
 *   of outer whitespace as Python's str.strip() does, a value whose stripped
 *   form is empty counts as absent, a stripped value over 512 bytes -> 400):
 *   X-OpenWebUI-User-Id, X-OpenWebUI-Chat-Id, X-WKVM-Stateful-Chat (must be
 *   exactly "parent-token-v1" when present), X-WKVM-Assistant-Message-ID,
 *   X-WKVM-User-Message-ID, X-WKVM-Parent-Message-ID (absent or empty on turn
 *   1). With the contract header the user id, chat id, assistant and user
 *   message ids are required; a message-id header without it is a 400.
 * - The checks of a follow-up and their order, and the reason strings, are
 *   those of ctl_session_reason (below), first failure wins.
 * - visible_parent_history_digest: SHA-256 (lowercase hex) of the UTF-8
 *   bytes of Python's json.dumps(msgs, sort_keys=True, separators=(",", ":"),
 *   ensure_ascii=False), where msgs is a JSON list of objects
 *   {"role": ROLE, "content": TEXT}: one per input message of the turn, in
 *   order, TEXT being the message content cleaned as the template renders it
 *   (wk_chat_clean()), then {"role": "assistant", "content": REPLY.strip()}
 *   with REPLY the visible text sent to the client and strip() Python's
 *   (Unicode whitespace). Keys sorted, so the bytes read
 *   [{"content":"hi","role":"user"},{"content":"Hello","role":"assistant"}].
 *   This mirrors the original's form (a list of role/content dicts);
 *   tests/reference/session_digest.py computes it in Python.
 * - retained_token_digest: SHA-256 over each retained id as int64
 *   little-endian (wk_sha256_token_ids_hex()).
 *
 * Extensions beyond the original, and rules the design leaves open:
 * - The session key is [model, user_id, chat_id] plus the API-key user, so
 *   two API users never share a session even with the same Open WebUI user
 *   and chat ids (see ctl_session_key()).
 * - Exact-prefix reuse: a request with X-OpenWebUI-Chat-Id but without the
 *   contract header continues its chat's parked state when the retained
 *   tokens are a prefix of its rendered prompt (user id optional; the key
 *   still holds it and the API user).
 * - Hidden terminal rule: the retained ids of a parked session are the
 *   tokens its state has consumed, including hidden ones (a generated
 *   end-of-text token 0, or the token that completed the "\n\n" stop).
 *   A follow-up continues when the retained ids, with every end-of-text id
 *   skipped, are a token-prefix of the new rendered prompt's tokens; the
 *   delta is the rest of the prompt. A retained id "\n\n" that the template
 *   also renders is simply part of the prefix (prefilled once); a retained
 *   end-of-text the template never renders is skipped (the state keeps it,
 *   the delta starts at the template's "\n\n"). Skipping every end-of-text,
 *   not only the last, is what lets turn 3 continue after turn 1 ended on
 *   one. A retokenization that splits the generated text differently
 *   (" He"+"llo" vs " "+"H"+"e"+...) is template_prefix_mismatch: a fresh
 *   start, never an error to the user.
 * - Outcomes and counters: see ctl_session_outcome.
 */
#ifndef CTL_SESSION_H
#define CTL_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wk_chat.h"
#include "wk_err.h"
#include "wk_sha256.h"
#include "wk_tok.h"

#define CTL_SESSION_CONTRACT "parent-token-v1" /* X-WKVM-Stateful-Chat value */
#define CTL_SESSION_HDR_MAX 512                /* bytes in a stripped header value */

#define CTL_SESSION_HDR_USER_ID "X-OpenWebUI-User-Id"
#define CTL_SESSION_HDR_CHAT_ID "X-OpenWebUI-Chat-Id"
#define CTL_SESSION_HDR_STATEFUL "X-WKVM-Stateful-Chat"
#define CTL_SESSION_HDR_ASSISTANT_ID "X-WKVM-Assistant-Message-ID"
#define CTL_SESSION_HDR_USER_MSG_ID "X-WKVM-User-Message-ID"
#define CTL_SESSION_HDR_PARENT_ID "X-WKVM-Parent-Message-ID"

#define CTL_SESSION_KEY_SIZE WK_SHA256_HEX_LEN /* 64 hex digits + NUL */

/* Limits on a binding; commit refuses more (WK_ETOOBIG), decode refuses more (WK_ECORRUPT). */
#define CTL_SESSION_MAX_MSGS 65536         /* canonical messages */
#define CTL_SESSION_MAX_TOKENS (1u << 24)  /* prompt ids, and retained ids */
#define CTL_SESSION_MAX_TEXT (64u << 20)   /* bytes in one message or the visible text */
#define CTL_SESSION_MAX_USED_IDS 4096      /* message ids remembered; the oldest drop out */
#define CTL_SESSION_MAX_REF 4096           /* bytes of the caller's opaque ref */
#define CTL_SESSION_MAX_BLOB (1024u << 20) /* bytes of an encoded binding */

/* The session headers of one request, stripped. Plain data, no fini. */
typedef struct ctl_session_hdrs {
    bool contract;                                  /* X-WKVM-Stateful-Chat: parent-token-v1 */
    char user_id[CTL_SESSION_HDR_MAX + 1];          /* X-OpenWebUI-User-Id, "" if absent */
    char chat_id[CTL_SESSION_HDR_MAX + 1];          /* X-OpenWebUI-Chat-Id, "" if absent */
    char assistant_msg_id[CTL_SESSION_HDR_MAX + 1]; /* X-WKVM-Assistant-Message-ID or "" */
    char user_msg_id[CTL_SESSION_HDR_MAX + 1];      /* X-WKVM-User-Message-ID or "" */
    char parent_msg_id[CTL_SESSION_HDR_MAX + 1];    /* X-WKVM-Parent-Message-ID, "" turn 1 */
} ctl_session_hdrs;

/* How a request relates to sessions, from its headers alone. */
typedef enum ctl_session_mode {
    CTL_SESSION_MODE_NONE = 0,     /* no chat id: stateless, nothing to look up or park */
    CTL_SESSION_MODE_PARENT_TOKEN, /* the parent-token-v1 contract */
    CTL_SESSION_MODE_EXACT_PREFIX, /* chat id without the contract: exact-prefix reuse */
} ctl_session_mode;

/* One request header, borrowed for the call. */
typedef struct ctl_session_hdr {
    const char *name;  /* header name, any case */
    const char *value; /* header value, NUL-terminated, unstripped */
} ctl_session_hdr;

/*
 * Header lookup for ctl_session_headers_parse(): returns the value of the
 * first header named name (compared case-insensitively, as civetweb's
 * mg_get_header() does), or NULL when absent. The value is borrowed until the
 * parse returns.
 */
typedef const char *(*ctl_session_hdr_get_fn)(void *ctx, const char *name);

/*
 * Parses the six session headers through get (ctx passed back to it). Checks,
 * in this order, the first failure wins: any stripped value over
 * CTL_SESSION_HDR_MAX bytes (headers in the order listed at the top);
 * X-WKVM-Stateful-Chat other than "parent-token-v1"; with the contract, a
 * missing user id, chat id, assistant message id, user message id (that
 * order); without it, any message-id header (assistant, user, parent order).
 * On success fills *out and returns WK_OK. On failure returns WK_EINVAL with
 * the reason, naming the header, in d (the caller answers 400 with an OpenAI
 * error body); *out is untouched. Thread-safe; get is called only from the
 * calling thread.
 */
WK_MUST_CHECK wk_err ctl_session_headers_parse(ctl_session_hdr_get_fn get, void *ctx,
                                               ctl_session_hdrs *out, wk_diag *d);

/*
 * Same as ctl_session_headers_parse() over n name/value pairs (borrowed for
 * the call); names match case-insensitively and the first match wins.
 */
WK_MUST_CHECK wk_err ctl_session_headers_parse_pairs(const ctl_session_hdr *hdrs, size_t n,
                                                     ctl_session_hdrs *out, wk_diag *d);

/* The mode of parsed headers. */
ctl_session_mode ctl_session_hdrs_mode(const ctl_session_hdrs *h);

/*
 * The store key of the session of h: lowercase hex SHA-256 of the domain tag
 * "wkvm-session-key-v1" plus its NUL, then, for each of model, h->user_id,
 * h->chat_id and api_user in this order, its byte length as uint64
 * little-endian and its bytes. This is the original's [model, user_id,
 * chat_id] extended with the API-key user (api_user: the user ctl_auth
 * resolved, "" when auth is off), length-prefixed so no two tuples collide,
 * and fixed-size so it fits any store key limit. Returns WK_OK; WK_EINVAL
 * when h's mode is CTL_SESSION_MODE_NONE (no session) or a string is NULL;
 * WK_ENOMEM. All arguments borrowed for the call.
 */
WK_MUST_CHECK wk_err ctl_session_key(const char *model, const char *api_user,
                                     const ctl_session_hdrs *h, char out[CTL_SESSION_KEY_SIZE],
                                     wk_diag *d);

/*
 * Renders msgs with the chat template and its generation prompt
 * (wk_chat_render()) and encodes the text with tok: the "full rendered
 * prompt" tokens that ctl_session_validate() and ctl_session_commit() take.
 * On success *ids is malloc'd (*n_ids entries), caller frees with free().
 * Returns WK_OK; WK_EINVAL for a bad role (from wk_chat_render()); WK_ENOMEM;
 * WK_ETOOBIG. Thread-safe on a shared tok.
 */
WK_MUST_CHECK wk_err ctl_session_prompt_encode(const wk_tok *tok, const wk_chat_msg *msgs, size_t n,
                                               int32_t **ids, size_t *n_ids, wk_diag *d);

/*
 * visible_parent_history_digest of n input messages plus the assistant reply
 * (reply_len bytes; the form at the top of this file: contents cleaned, the
 * reply stripped; a NULL content is "", as for wk_chat_render()). All
 * borrowed for the call; thread-safe. Returns WK_OK; WK_EINVAL for a NULL
 * role or a text that is not valid UTF-8 (it has no JSON form); WK_ENOMEM.
 */
WK_MUST_CHECK wk_err ctl_session_history_digest(const wk_chat_msg *msgs, size_t n,
                                                const char *reply, size_t reply_len,
                                                char out[WK_SHA256_HEX_LEN], wk_diag *d);

/*
 * Why a parent-token-v1 follow-up did not continue. The checks run in the
 * order of this enum and the first failure is the reason. Strings are those
 * of ctl_session_reason_str(), the original's.
 */
typedef enum ctl_session_reason {
    CTL_SESSION_REASON_NONE = 0,
    /* the stored binding was not made under parent-token-v1 (an exact-prefix binding) */
    CTL_SESSION_REASON_CONTRACT_MISMATCH,
    /* the binding holds no request metadata (last assistant/user message ids) */
    CTL_SESSION_REASON_REQUEST_METADATA_UNAVAILABLE,
    /* the binding holds no visible history: the turn did not complete (aborted, failed) */
    CTL_SESSION_REASON_SESSION_HISTORY_UNAVAILABLE,
    /* X-WKVM-Parent-Message-ID differs from the binding's last assistant message id */
    CTL_SESSION_REASON_PARENT_MESSAGE_MISMATCH,
    /* X-WKVM-Assistant-Message-ID was already used in this session (as any message id) */
    CTL_SESSION_REASON_ASSISTANT_MESSAGE_REUSED,
    /* X-WKVM-User-Message-ID was already used in this session (as any message id) */
    CTL_SESSION_REASON_USER_MESSAGE_REUSED,
    /* the stored retained_token_digest does not match the stored retained ids */
    CTL_SESSION_REASON_RETAINED_HISTORY_MISMATCH,
    /* the request's first messages (cleaned) differ from the binding's input messages */
    CTL_SESSION_REASON_PRIOR_HISTORY_MISMATCH,
    /* no message after that prefix, or it is not an assistant message */
    CTL_SESSION_REASON_PRIOR_ASSISTANT_MISSING,
    /* that assistant message, stripped, differs from the stored visible text, stripped */
    CTL_SESSION_REASON_PRIOR_ASSISTANT_MISMATCH,
    /* the history digest recomputed from the request differs from the stored one */
    CTL_SESSION_REASON_PARENT_HISTORY_DIGEST_MISMATCH,
    /* nothing follows the prior assistant message */
    CTL_SESSION_REASON_NEW_MESSAGES_MISSING,
    /* the retained ids (end-of-text skipped) are not a token-prefix of the new prompt */
    CTL_SESSION_REASON_TEMPLATE_PREFIX_MISMATCH,
    /* the prompt has no token after the retained ones */
    CTL_SESSION_REASON_CONTINUATION_EMPTY,
    /* the parked state is gone or damaged, or the stored binding failed to decode */
    CTL_SESSION_REASON_SESSION_UNAVAILABLE,
    CTL_SESSION_REASON__COUNT
} ctl_session_reason;

/*
 * What the caller does with a request, and which counter it increments:
 *   HIT          prefill prompt_ids[reused_tokens..] into the parked state;
 *                parent_bound_continuation_hits += 1,
 *                prefix_tokens_reused += reused_tokens.
 *   MISS         a contract request on turn > 1 (non-empty parent id) whose
 *                key has no binding: fresh start; parent_bound_continuation_misses += 1.
 *   REJECTED     a contract request on turn > 1 whose binding failed a check:
 *                retire it, fresh start; parent_bound_continuation_rejections{reason} += 1.
 *   FIRST        a contract request on turn 1 (empty parent id): fresh start,
 *                neither hit nor miss nor rejection; retire is set when a binding
 *                existed (the chat's first message was edited or regenerated).
 *   PREFIX_HIT   exact-prefix reuse without the contract, as HIT;
 *                chat_exact_prefix_reuse_hits += 1, prefix_tokens_reused += reused_tokens.
 *   PREFIX_MISS  no reuse without the contract: fresh start, no counter; reason
 *                says why when a binding existed (for logs only).
 *   NONE         no chat id: stateless, no counter, nothing to commit.
 */
typedef enum ctl_session_outcome {
    CTL_SESSION_OUTCOME_NONE = 0,
    CTL_SESSION_OUTCOME_FIRST,
    CTL_SESSION_OUTCOME_HIT,
    CTL_SESSION_OUTCOME_MISS,
    CTL_SESSION_OUTCOME_REJECTED,
    CTL_SESSION_OUTCOME_PREFIX_HIT,
    CTL_SESSION_OUTCOME_PREFIX_MISS,
} ctl_session_outcome;

/* The decision for one request. Plain data. */
typedef struct ctl_session_result {
    ctl_session_outcome outcome; /* see ctl_session_outcome */
    ctl_session_reason reason;   /* REJECTED: the first failed check; PREFIX_MISS: why */
    size_t reused_tokens;        /* HIT, PREFIX_HIT: prompt tokens the parked state covers */
    size_t reused_bytes;         /* text mode: bytes of prompt_text the parked state covers */
    bool retire;                 /* delete the stored binding and free its parked state */
} ctl_session_result;

/* A parked session's binding. Opaque; free with ctl_session_binding_free(). */
typedef struct ctl_session_binding ctl_session_binding;

/* A request as validate and commit see it. All borrowed for the call. */
typedef struct ctl_session_request {
    const ctl_session_hdrs *hdrs; /* parsed headers */
    const wk_chat_msg *msgs;      /* the request's messages, in order */
    size_t n_msgs;                /* entries in msgs */
    const int32_t *prompt_ids;    /* full rendered prompt (ctl_session_prompt_encode()) */
    size_t n_prompt;              /* entries in prompt_ids */
    const wk_tok *tok;            /* with prompt_text: match retained tokens on text */
    const char *prompt_text;      /* the full rendered prompt text, or NULL */
    size_t prompt_len;            /* bytes of prompt_text */
    /*
     * Text mode with a model's own chat template: where the text after
     * message k (the parked reply) starts in prompt_text, for the retained
     * ids (n); false when the rendering does not line up. NULL: the World
     * template's rule (ctl_session_align()).
     */
    bool (*align)(void *ctx, const int32_t *retained, size_t n, size_t k, size_t *off);
    void *align_ctx;              /* align's first argument */
} ctl_session_request;

/*
 * Decides how req relates to b, the binding stored under its key (NULL when
 * there is none). Contract requests: turn 1 (empty parent id) is FIRST;
 * otherwise no binding is MISS, and a binding runs the checks of
 * ctl_session_reason in order (HIT or REJECTED). Requests without the
 * contract but with a chat id: PREFIX_HIT when b is an exact-prefix binding
 * whose retained digest holds and whose retained ids (end-of-text skipped)
 * are a prefix of the prompt with at least one token after them; otherwise
 * PREFIX_MISS (retire set when b existed). On success writes *res and
 * returns WK_OK, whatever the decision. WK_EINVAL for a NULL argument or
 * message field; WK_ENOMEM. b and req are borrowed; b is only read.
 */
WK_MUST_CHECK wk_err ctl_session_validate(const ctl_session_request *req,
                                          const ctl_session_binding *b, ctl_session_result *res,
                                          wk_diag *d);

/*
 * The binding exists but can't be used: the caller found the parked state
 * behind a HIT/PREFIX_HIT gone or damaged, or the stored bytes failed
 * ctl_session_binding_decode() (then validate with b = NULL first). Turns
 * HIT and MISS into REJECTED with session_unavailable, PREFIX_HIT into
 * PREFIX_MISS with session_unavailable; keeps an earlier rejection's reason
 * and FIRST's outcome; sets reused_tokens to 0 and retire. NONE is left as is.
 */
void ctl_session_result_unavailable(ctl_session_result *res);

/*
 * Text mode of the template-prefix check (a request with tok and
 * prompt_text): the parked state's retained ids are kept exactly as the
 * model produced them, never retokenized. The follow-up continues when the
 * bytes of the retained ids (end-of-text skipped) are a prefix of the new
 * rendered prompt text; *bytes receives that prefix's length, and the
 * caller encodes only the rest (the delta) for prefill. This is the
 * original's rule: noncanonical and hidden tokens survive, and a reply
 * whose tokenization differs from a fresh encode still continues. The
 * bytes are those the encoder saw (wk_tok_text_prefix()): with an hf-spm
 * tokenizer the space of the "\u2581" its encoder put in front of the
 * text (and after an added token, where its form does so) is not counted,
 * and the caller encodes the delta with wk_tok_encode_continue(), which puts
 * none at its start unless the whole text would have one there. World and
 * hf-bpe: the plain pieces.
 */
bool ctl_session_text_prefix(const wk_tok *tok, const int32_t *retained, size_t n,
                             const char *text, size_t len, size_t *bytes);

/*
 * True when the state after the n ids (borrowed) has ended the template's
 * turn: their last bytes are "\n\n" (the default stop string, fed) and no
 * end-of-text is among the tokens that make them. A reply cut by max_tokens,
 * by another stop string, or ended by end-of-text is not.
 */
bool ctl_session_retained_terminated(const wk_tok *tok, const int32_t *ids, size_t n);

/*
 * Where the template delta starts after a parked turn, in the text of msgs
 * rendered with the generation prompt: msgs[k] is that turn's reply as the
 * client shows it, and the retained ids (n, borrowed) are what the state
 * consumed up to its end. The retained ids stand for the rendered text up
 * to the reply's content end whatever their bytes were (invalid UTF-8, a
 * cut character, other whitespace: the visible-history checks compare what
 * the client shows); when they ended the turn (ctl_session_retained_terminated())
 * the template's "\n\n" after the reply is theirs too. *off: a byte offset
 * into that rendered text; the caller encodes text[*off..] with
 * wk_tok_encode_continue(). WK_OK; WK_EINVAL (k out of range, a bad role),
 * WK_ENOMEM. Pure and thread-safe.
 */
/*
 * ctl_session_align()'s rule for a reply already rendered at span reply:
 * its end when the retained ids ended the turn, else its content's end.
 */
size_t ctl_session_align_at(const wk_tok *tok, const int32_t *retained, size_t n,
                            const wk_chat_span *reply);

WK_MUST_CHECK wk_err ctl_session_align(const wk_tok *tok, const int32_t *retained, size_t n,
                                       const wk_chat_msg *msgs, size_t n_msgs, size_t k,
                                       size_t *off, wk_diag *d);

/* The reason string ("parent_message_mismatch"), static; "" for NONE, "unknown" if invalid. */
const char *ctl_session_reason_str(ctl_session_reason r);

/* The outcome name ("hit", "miss", "rejected", "first", "prefix_hit", ...), static. */
const char *ctl_session_outcome_str(ctl_session_outcome o);

/* A completed (or aborted) turn, for ctl_session_commit(). All borrowed for the call. */
typedef struct ctl_session_turn {
    const ctl_session_request *req;  /* the request, as validated */
    const ctl_session_result *res;   /* its result, after ctl_session_result_unavailable() */
    const ctl_session_binding *prev; /* the binding continued on HIT/PREFIX_HIT, else NULL */
    const int32_t *gen_ids;          /* sampled ids the parked state consumed, in order */
    size_t n_gen;                    /* entries in gen_ids */
    const char *visible;             /* text sent to the client; NULL: turn did not complete */
    size_t visible_len;              /* bytes of visible */
} ctl_session_turn;

/*
 * Builds the binding to park after a turn. Retained ids: on HIT/PREFIX_HIT
 * prev's retained ids plus prompt_ids[reused_tokens..], otherwise the whole
 * prompt; then gen_ids. gen_ids must be exactly what the state consumed after
 * the prompt: include the final sampled id (end-of-text, or the token that
 * completed the stop string) only if the scheduler fed it before parking.
 * Input messages: req's messages, cleaned. Message ids: the headers'
 * assistant and user ids become the last ones and join prev's used ids on a
 * HIT (a fresh start forgets the retired session's ids); at most
 * CTL_SESSION_MAX_USED_IDS are kept, the oldest dropped. visible NULL (a
 * turn cut short) records no history, so a follow-up is rejected with
 * session_history_unavailable. Contract requests make parent-token-v1
 * bindings, others exact-prefix ones. On success *out is a new binding,
 * caller frees with ctl_session_binding_free(); its ref is empty. Returns
 * WK_OK; WK_EINVAL for mode NONE, a HIT without prev, an id out of
 * 0..WK_TOK_MAX_ID, a bad role, or text that is not valid UTF-8; WK_ETOOBIG
 * over a CTL_SESSION_MAX_* limit (do not park); WK_ENOMEM.
 */
WK_MUST_CHECK wk_err ctl_session_commit(const ctl_session_turn *t, ctl_session_binding **out,
                                        wk_diag *d);

/* Frees a binding. NULL-safe. */
void ctl_session_binding_free(ctl_session_binding *b);

/*
 * The retained ids (what the parked state has consumed), borrowed until the
 * binding is freed; *n is set. Compare with the slot's token count.
 */
const int32_t *ctl_session_binding_retained(const ctl_session_binding *b, size_t *n);

/* retained_token_digest as lowercase hex, borrowed until the binding is freed. */
const char *ctl_session_binding_retained_digest(const ctl_session_binding *b);

/*
 * The caller's opaque reference to the parked state (e.g. worker, slot,
 * generation or a blob id), stored and encoded verbatim; this module never
 * reads it. set copies len bytes (len 0 clears); WK_ETOOBIG over
 * CTL_SESSION_MAX_REF, WK_ENOMEM (the old ref is kept on failure). Not
 * thread-safe against readers of the same binding.
 */
WK_MUST_CHECK wk_err ctl_session_binding_set_ref(ctl_session_binding *b, const void *ref,
                                                 size_t len);

/* The ref, borrowed until the binding is freed or its ref set; *len is set (0: none). */
const void *ctl_session_binding_ref(const ctl_session_binding *b, size_t *len);

/*
 * Serializes b for the store: little-endian, versioned, with a SHA-256
 * trailer (format in ctl_session.c). On success *out is malloc'd (*len
 * bytes), caller frees with free(). Returns WK_OK; WK_ETOOBIG over
 * CTL_SESSION_MAX_BLOB; WK_ENOMEM.
 */
WK_MUST_CHECK wk_err ctl_session_binding_encode(const ctl_session_binding *b, uint8_t **out,
                                                size_t *len, wk_diag *d);

/*
 * Parses len bytes at buf (borrowed for the call, treated as hostile: every
 * length is bounded and checked before use, the checksum first). On success
 * *out is a new binding, caller frees with ctl_session_binding_free().
 * Returns WK_OK; WK_ENOTSUP for another format version; WK_ECORRUPT for
 * anything else malformed, with d saying what; WK_ENOMEM. On failure the
 * caller treats the session as unavailable (ctl_session_result_unavailable()).
 */
WK_MUST_CHECK wk_err ctl_session_binding_decode(const void *buf, size_t len,
                                                ctl_session_binding **out, wk_diag *d);

#endif /* CTL_SESSION_H */
