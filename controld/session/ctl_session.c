/*
 * ctl_session: parent-token-v1 header parsing, session keys, the follow-up
 * checks, the hidden-terminal prefix rule, binding commit and the binding's
 * byte format. The contract and the rules chosen where the design is silent
 * are documented in ctl_session.h.
 *
 * This module must never do I/O, log, keep global state or trust stored
 * bytes: it decides, the caller acts. A decision is never an error; errors
 * are for bad arguments, memory and limits.
 *
 * Encoded binding, version 1 (all integers little-endian; str = u32 byte
 * length + bytes; ids = u32 count + that many int32):
 *   "WKVMSESS"          8-byte magic
 *   u32 version         1
 *   u32 flags           bit 0 has_meta, bit 1 has_history, others 0
 *   u32 contract        1 parent-token-v1, 2 exact-prefix
 *   u32 n_msgs, then n_msgs times: str role, str content (cleaned)
 *   ids prompt          rendered prompt of the turn
 *   ids retained        what the parked state consumed
 *   64 bytes            retained_token_digest, lowercase hex
 *   [has_meta]          str last_assistant_id, str last_user_id
 *   u32 n_used, then n_used times: str message id
 *   [has_history]       str visible, 64 bytes visible_parent_history_digest (hex)
 *   str ref             the caller's opaque bytes
 *   32 bytes            SHA-256 of every byte before it
 * Nothing may follow the checksum.
 */
#include "ctl_session.h"
#include "ctl_session_priv.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "wk_json.h"

#define SESSION_MAGIC "WKVMSESS"
#define SESSION_MAGIC_LEN 8
#define SESSION_VERSION 1u
#define SESSION_FLAG_META 1u
#define SESSION_FLAG_HISTORY 2u
#define SESSION_KEY_TAG "wkvm-session-key-v1" /* hashed with its NUL */
#define SESSION_DIGEST_HEX 64                 /* hex digits in a digest */
#define SESSION_N_HDRS 6

/* Header order: the order of every check in ctl_session_headers_parse(). */
enum {
    SESSION_HDR_USER_ID = 0,
    SESSION_HDR_CHAT_ID,
    SESSION_HDR_STATEFUL,
    SESSION_HDR_ASSISTANT_ID,
    SESSION_HDR_USER_MSG_ID,
    SESSION_HDR_PARENT_ID,
};

static const char *const session_hdr_names[SESSION_N_HDRS] = {
    CTL_SESSION_HDR_USER_ID,      CTL_SESSION_HDR_CHAT_ID,     CTL_SESSION_HDR_STATEFUL,
    CTL_SESSION_HDR_ASSISTANT_ID, CTL_SESSION_HDR_USER_MSG_ID, CTL_SESSION_HDR_PARENT_ID,
};

static const char *const session_reason_names[CTL_SESSION_REASON__COUNT] = {
    [CTL_SESSION_REASON_NONE] = "",
    [CTL_SESSION_REASON_CONTRACT_MISMATCH] = "contract_mismatch",
    [CTL_SESSION_REASON_REQUEST_METADATA_UNAVAILABLE] = "request_metadata_unavailable",
    [CTL_SESSION_REASON_SESSION_HISTORY_UNAVAILABLE] = "session_history_unavailable",
    [CTL_SESSION_REASON_PARENT_MESSAGE_MISMATCH] = "parent_message_mismatch",
    [CTL_SESSION_REASON_ASSISTANT_MESSAGE_REUSED] = "assistant_message_reused",
    [CTL_SESSION_REASON_USER_MESSAGE_REUSED] = "user_message_reused",
    [CTL_SESSION_REASON_RETAINED_HISTORY_MISMATCH] = "retained_history_mismatch",
    [CTL_SESSION_REASON_PRIOR_HISTORY_MISMATCH] = "prior_history_mismatch",
    [CTL_SESSION_REASON_PRIOR_ASSISTANT_MISSING] = "prior_assistant_missing",
    [CTL_SESSION_REASON_PRIOR_ASSISTANT_MISMATCH] = "prior_assistant_mismatch",
    [CTL_SESSION_REASON_PARENT_HISTORY_DIGEST_MISMATCH] = "parent_history_digest_mismatch",
    [CTL_SESSION_REASON_NEW_MESSAGES_MISSING] = "new_messages_missing",
    [CTL_SESSION_REASON_TEMPLATE_PREFIX_MISMATCH] = "template_prefix_mismatch",
    [CTL_SESSION_REASON_CONTINUATION_EMPTY] = "continuation_empty",
    [CTL_SESSION_REASON_SESSION_UNAVAILABLE] = "session_unavailable",
};

/* A role and a text, borrowed: the input of the history digest. */
typedef struct session_text {
    const char *role; /* NUL-terminated */
    const char *s;    /* len bytes */
    size_t len;       /* bytes of s */
} session_text;

/* ------------------------------------------------------------ text ---- */

/*
 * The visible form of a reply as a client persists it: NUL bytes removed
 * (Open WebUI's sanitize_text_for_db), then outer Unicode whitespace
 * stripped (str.strip()). *out is malloc'd (NUL-terminated, *n bytes).
 */
static wk_err
session_visible_dup(const char *s, size_t len, char **out, size_t *n)
{
    char *buf = malloc(len + 1);
    if (buf == NULL)
        return WK_ENOMEM;
    size_t m = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] != '\0')
            buf[m++] = s[i];
    }
    size_t off = 0, vn = 0;
    wk_chat_strip(buf, m, &off, &vn);
    memmove(buf, buf + off, vn);
    buf[vn] = '\0';
    *out = buf;
    *n = vn;
    return WK_OK;
}

/* True when s (len bytes) is valid UTF-8 as jansson accepts it (no overlongs, no surrogates). */
static bool
session_utf8_valid(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;

    while (i < len) {
        unsigned c = u[i];
        size_t need;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf) {
            need = 1;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            need = 2;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            need = 3;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (len - i - 1 < need)
            return false;
        for (size_t k = 1; k <= need; k++) {
            if ((u[i + k] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (u[i + k] & 0x3f);
        }
        if ((need == 2 && cp < 0x800) || (need == 3 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += need + 1;
    }
    return true;
}

/* The content of m: NULL is "", content_len 0 means NUL-terminated (as wk_chat_render()). */
static void
session_msg_text(const wk_chat_msg *m, const char **s, size_t *len)
{
    *s = m->content ? m->content : "";
    *len = m->content_len ? m->content_len : strlen(*s);
}

/* True for the roles the template renders. */
static bool
session_role_valid(const char *role, size_t len)
{
    return (len == 6 && memcmp(role, "system", 6) == 0) ||
           (len == 4 && memcmp(role, "user", 4) == 0) ||
           (len == 9 && memcmp(role, "assistant", 9) == 0);
}

/* True when s is SESSION_DIGEST_HEX lowercase hex digits followed by NUL. */
static bool
session_hex_valid(const char *s)
{
    for (size_t i = 0; i < SESSION_DIGEST_HEX; i++) {
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    }
    return s[SESSION_DIGEST_HEX] == '\0';
}

/* A malloc'd copy of len bytes plus a NUL, or NULL on ENOMEM. */
static char *
session_memdup(const void *p, size_t len)
{
    char *s = malloc(len + 1);
    if (s == NULL)
        return NULL;
    if (len)
        memcpy(s, p, len);
    s[len] = '\0';
    return s;
}

/* --------------------------------------------------------- headers ---- */

wk_err
ctl_session_headers_parse(ctl_session_hdr_get_fn get, void *ctx, ctl_session_hdrs *out, wk_diag *d)
{
    const char *val[SESSION_N_HDRS];
    size_t len[SESSION_N_HDRS];

    if (get == NULL || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "session headers: NULL argument");
    for (int i = 0; i < SESSION_N_HDRS; i++) {
        const char *raw = get(ctx, session_hdr_names[i]);
        size_t off = 0, n = 0;
        if (raw != NULL)
            wk_chat_strip(raw, strlen(raw), &off, &n);
        val[i] = raw != NULL ? raw + off : "";
        len[i] = n;
        if (n > CTL_SESSION_HDR_MAX)
            return wk_diag_set(d, WK_EINVAL, "header %s is longer than %d bytes",
                               session_hdr_names[i], CTL_SESSION_HDR_MAX);
    }
    bool contract = len[SESSION_HDR_STATEFUL] > 0;
    if (contract && (len[SESSION_HDR_STATEFUL] != strlen(CTL_SESSION_CONTRACT) ||
                     memcmp(val[SESSION_HDR_STATEFUL], CTL_SESSION_CONTRACT,
                            strlen(CTL_SESSION_CONTRACT)) != 0))
        return wk_diag_set(d, WK_EINVAL, "header %s must be '%s'", CTL_SESSION_HDR_STATEFUL,
                           CTL_SESSION_CONTRACT);
    if (contract) {
        static const int required[] = {SESSION_HDR_USER_ID, SESSION_HDR_CHAT_ID,
                                       SESSION_HDR_ASSISTANT_ID, SESSION_HDR_USER_MSG_ID};
        for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
            if (len[required[i]] == 0)
                return wk_diag_set(d, WK_EINVAL, "header %s is required with %s: %s",
                                   session_hdr_names[required[i]], CTL_SESSION_HDR_STATEFUL,
                                   CTL_SESSION_CONTRACT);
        }
    } else {
        static const int ids[] = {SESSION_HDR_ASSISTANT_ID, SESSION_HDR_USER_MSG_ID,
                                  SESSION_HDR_PARENT_ID};
        for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
            if (len[ids[i]] > 0)
                return wk_diag_set(d, WK_EINVAL, "header %s requires %s: %s",
                                   session_hdr_names[ids[i]], CTL_SESSION_HDR_STATEFUL,
                                   CTL_SESSION_CONTRACT);
        }
    }
    memset(out, 0, sizeof(*out));
    out->contract = contract;
    memcpy(out->user_id, val[SESSION_HDR_USER_ID], len[SESSION_HDR_USER_ID]);
    memcpy(out->chat_id, val[SESSION_HDR_CHAT_ID], len[SESSION_HDR_CHAT_ID]);
    memcpy(out->assistant_msg_id, val[SESSION_HDR_ASSISTANT_ID], len[SESSION_HDR_ASSISTANT_ID]);
    memcpy(out->user_msg_id, val[SESSION_HDR_USER_MSG_ID], len[SESSION_HDR_USER_MSG_ID]);
    memcpy(out->parent_msg_id, val[SESSION_HDR_PARENT_ID], len[SESSION_HDR_PARENT_ID]);
    return WK_OK;
}

/* The pair array behind ctl_session_headers_parse_pairs(). */
typedef struct session_pairs {
    const ctl_session_hdr *h; /* borrowed */
    size_t n;                 /* entries */
} session_pairs;

static const char *
session_pairs_get(void *ctx, const char *name)
{
    const session_pairs *p = ctx;
    for (size_t i = 0; i < p->n; i++) {
        if (p->h[i].name != NULL && strcasecmp(p->h[i].name, name) == 0)
            return p->h[i].value;
    }
    return NULL;
}

wk_err
ctl_session_headers_parse_pairs(const ctl_session_hdr *hdrs, size_t n, ctl_session_hdrs *out,
                                wk_diag *d)
{
    session_pairs p = {hdrs, hdrs != NULL ? n : 0};
    return ctl_session_headers_parse(session_pairs_get, &p, out, d);
}

ctl_session_mode
ctl_session_hdrs_mode(const ctl_session_hdrs *h)
{
    if (h->contract)
        return CTL_SESSION_MODE_PARENT_TOKEN;
    if (h->chat_id[0] != '\0')
        return CTL_SESSION_MODE_EXACT_PREFIX;
    return CTL_SESSION_MODE_NONE;
}

/* ------------------------------------------------------------- key ---- */

/* Adds a length-prefixed string to s. */
static void
session_key_put(wk_sha256 *s, const char *str)
{
    uint64_t n = strlen(str);
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(n >> (8 * i));
    wk_sha256_update(s, le, sizeof(le));
    wk_sha256_update(s, str, (size_t)n);
}

wk_err
ctl_session_key(const char *model, const char *api_user, const ctl_session_hdrs *h,
                char out[CTL_SESSION_KEY_SIZE], wk_diag *d)
{
    wk_sha256 s;
    uint8_t dg[WK_SHA256_LEN];

    if (model == NULL || api_user == NULL || h == NULL)
        return wk_diag_set(d, WK_EINVAL, "session key: NULL argument");
    if (ctl_session_hdrs_mode(h) == CTL_SESSION_MODE_NONE)
        return wk_diag_set(d, WK_EINVAL, "session key: the request names no chat");
    if (wk_sha256_init(&s) != WK_OK)
        return WK_ENOMEM;
    wk_sha256_update(&s, SESSION_KEY_TAG, sizeof(SESSION_KEY_TAG));
    session_key_put(&s, model);
    session_key_put(&s, h->user_id);
    session_key_put(&s, h->chat_id);
    session_key_put(&s, api_user);
    wk_sha256_final(&s, dg);
    wk_sha256_to_hex(dg, out);
    return WK_OK;
}

/* ---------------------------------------------------------- prompt ---- */

wk_err
ctl_session_prompt_encode(const wk_tok *tok, const wk_chat_msg *msgs, size_t n, int32_t **ids,
                          size_t *n_ids, wk_diag *d)
{
    char *text = NULL;
    size_t len = 0;

    if (tok == NULL || (msgs == NULL && n > 0) || ids == NULL || n_ids == NULL)
        return wk_diag_set(d, WK_EINVAL, "session prompt: NULL argument");
    wk_err err = wk_chat_render(msgs, n, true, &text, &len, d);
    if (err != WK_OK)
        return err;
    err = wk_tok_encode(tok, text, len, ids, n_ids, d);
    free(text);
    return err;
}

/* ---------------------------------------------------------- digest ---- */

/* visible_parent_history_digest of n texts (contents already cleaned) plus the reply. */
static wk_err
session_digest(const session_text *msgs, size_t n, const char *reply, size_t reply_len,
               char out[WK_SHA256_HEX_LEN], wk_diag *d)
{
    size_t rn;
    wk_err err = WK_OK;
    char *vis = NULL;

    for (size_t i = 0; i < n; i++) {
        if (!session_utf8_valid(msgs[i].role, strlen(msgs[i].role)) ||
            !session_utf8_valid(msgs[i].s, msgs[i].len))
            return wk_diag_set(d, WK_EINVAL, "message %zu is not valid UTF-8", i);
    }
    if (session_visible_dup(reply, reply_len, &vis, &rn) != WK_OK)
        return WK_ENOMEM;
    if (!session_utf8_valid(vis, rn)) {
        free(vis);
        return wk_diag_set(d, WK_EINVAL, "the assistant reply is not valid UTF-8");
    }
    json_t *arr = json_array();
    if (arr == NULL) {
        free(vis);
        return WK_ENOMEM;
    }
    for (size_t i = 0; i <= n && err == WK_OK; i++) {
        const char *role = i < n ? msgs[i].role : "assistant";
        const char *s = i < n ? msgs[i].s : vis;
        size_t len = i < n ? msgs[i].len : rn;
        json_t *o = json_pack("{s:s, s:s%}", "role", role, "content", s, len);
        if (o == NULL || json_array_append_new(arr, o) != 0)
            err = WK_ENOMEM;
    }
    char *js = err == WK_OK ? wk_json_dump_canonical(arr) : NULL;
    json_decref(arr);
    free(vis);
    if (err != WK_OK)
        return err;
    if (js == NULL)
        return WK_ENOMEM;
    wk_sha256_hex(js, strlen(js), out);
    free(js);
    return WK_OK;
}

/* Frees n cleaned texts made by session_clean_all(). */
static void
session_texts_free(session_text *t, size_t n)
{
    if (t == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        free((char *)t[i].s);
    free(t);
}

/*
 * Cleans the first n messages into a new array (contents malloc'd; free with
 * session_texts_free()). Roles are borrowed from msgs. WK_EINVAL for a NULL
 * role, WK_ENOMEM.
 */
static wk_err
session_clean_all(const wk_chat_msg *msgs, size_t n, session_text **out, wk_diag *d)
{
    session_text *t = calloc(n ? n : 1, sizeof(*t));
    if (t == NULL)
        return WK_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        char *clean = NULL;
        if (msgs[i].role == NULL) {
            session_texts_free(t, i);
            return wk_diag_set(d, WK_EINVAL, "message %zu: missing role", i);
        }
        session_msg_text(&msgs[i], &s, &len);
        if (wk_chat_clean(s, len, &clean) != WK_OK) {
            session_texts_free(t, i);
            return WK_ENOMEM;
        }
        t[i].role = msgs[i].role;
        t[i].s = clean;
        t[i].len = strlen(clean);
    }
    *out = t;
    return WK_OK;
}

wk_err
ctl_session_history_digest(const wk_chat_msg *msgs, size_t n, const char *reply, size_t reply_len,
                           char out[WK_SHA256_HEX_LEN], wk_diag *d)
{
    session_text *t = NULL;

    if ((msgs == NULL && n > 0) || (reply == NULL && reply_len > 0))
        return wk_diag_set(d, WK_EINVAL, "history digest: NULL argument");
    wk_err err = session_clean_all(msgs, n, &t, d);
    if (err != WK_OK)
        return err;
    err = session_digest(t, n, reply ? reply : "", reply_len, out, d);
    session_texts_free(t, n);
    return err;
}

/* ---------------------------------------------------------- decide ---- */

bool
ctl_session_prefix_match(const int32_t *retained, size_t n_retained, const int32_t *prompt,
                         size_t n_prompt, size_t *off)
{
    size_t j = 0;

    for (size_t i = 0; i < n_retained; i++) {
        if (retained[i] == WK_TOK_EOT)
            continue; /* hidden: the template never renders end-of-text */
        if (j >= n_prompt || prompt[j] != retained[i])
            return false;
        j++;
    }
    *off = j;
    return true;
}

bool
ctl_session_text_prefix(const wk_tok *tok, const int32_t *retained, size_t n, const char *text,
                        size_t len, size_t *bytes)
{
    /* End-of-text is hidden: the template never renders it. */
    return wk_tok_text_prefix(tok, retained, n, wk_tok_eos(tok), text, len, bytes);
}

/* The template-prefix check in token or text mode; *off counts tokens or bytes. */
static bool
session_prefix_ok(const ctl_session_request *req, const ctl_session_binding *b, size_t *off)
{
    if (req->tok != NULL && req->prompt_text != NULL)
        return ctl_session_text_prefix(req->tok, b->retained, b->n_retained, req->prompt_text,
                                       req->prompt_len, off);
    return ctl_session_prefix_match(b->retained, b->n_retained, req->prompt_ids, req->n_prompt,
                                    off);
}

bool
ctl_session_retained_terminated(const wk_tok *tok, const int32_t *ids, size_t n)
{
    /* The last bytes the state consumed, from the last tokens' pieces. */
    uint8_t tail[2];
    size_t have = 0;
    int32_t eos = tok != NULL ? wk_tok_eos(tok) : -1;
    if (tok == NULL || n == 0 || ids[n - 1] == eos)
        return false;
    for (size_t i = n; i > 0 && have < 2; i--) {
        size_t pl = 0;
        const uint8_t *p = wk_tok_piece(tok, ids[i - 1], &pl);
        if (ids[i - 1] == eos)
            return false; /* an end-of-text inside the last bytes: the turn was ended by it */
        for (size_t j = pl; j > 0 && have < 2 && p != NULL; j--)
            tail[1 - have++] = p[j - 1];
    }
    return have == 2 && tail[0] == '\n' && tail[1] == '\n';
}

size_t
ctl_session_align_at(const wk_tok *tok, const int32_t *retained, size_t n,
                     const wk_chat_span *reply)
{
    return ctl_session_retained_terminated(tok, retained, n) ? reply->end : reply->content_end;
}

wk_err
ctl_session_align(const wk_tok *tok, const int32_t *retained, size_t n, const wk_chat_msg *msgs,
                  size_t n_msgs, size_t k, size_t *off, wk_diag *d)
{
    if (msgs == NULL || k >= n_msgs)
        return wk_diag_set(d, WK_EINVAL, "align: no message %zu", k);
    wk_chat_span *sp = calloc(n_msgs, sizeof(*sp));
    char *text = NULL;
    size_t len = 0;
    if (sp == NULL)
        return WK_ENOMEM;
    wk_err err = wk_chat_render_spans(msgs, n_msgs, true, &text, &len, sp, d);
    if (err == WK_OK)
        *off = ctl_session_align_at(tok, retained, n, &sp[k]);
    free(text);
    free(sp);
    return err;
}

/*
 * The template check of a follow-up whose message k is the parked turn's
 * reply. Text mode: the retained ids stand for the rendered text up to that
 * reply's end, whatever their bytes were (the visible-history checks before
 * this one proved the client saw what was sent); *off is where the delta
 * starts (ctl_session_align()). Token mode: the original token-prefix rule.
 */
static bool
session_align_ok(const ctl_session_request *req, const ctl_session_binding *b, size_t k,
                 size_t *off)
{
    if (req->tok == NULL || req->prompt_text == NULL)
        return session_prefix_ok(req, b, off);
    if (req->align != NULL)
        return req->align(req->align_ctx, b->retained, b->n_retained, k, off) &&
               *off <= req->prompt_len;
    if (ctl_session_align(req->tok, b->retained, b->n_retained, req->msgs, req->n_msgs, k, off,
                          NULL) != WK_OK)
        return false;
    return *off <= req->prompt_len;
}

/* Length of what the prefix check ran over: text bytes or prompt tokens. */
static size_t
session_prompt_extent(const ctl_session_request *req)
{
    return req->tok != NULL && req->prompt_text != NULL ? req->prompt_len : req->n_prompt;
}

/* True when id is one of b's used message ids. */
static bool
session_used(const ctl_session_binding *b, const char *id)
{
    for (size_t i = 0; i < b->n_used; i++) {
        if (strcmp(b->used[i], id) == 0)
            return true;
    }
    return false;
}

/* True when b's stored retained digest is that of its retained ids. */
static wk_err
session_retained_ok(const ctl_session_binding *b, bool *ok)
{
    char hex[WK_SHA256_HEX_LEN];
    if (wk_sha256_token_ids_hex(b->retained, b->n_retained, hex) != WK_OK)
        return WK_ENOMEM;
    *ok = strcmp(hex, b->retained_digest) == 0;
    return WK_OK;
}

/* The parent-token-v1 checks, in order. Sets *reason (NONE: hit) and *off. */
static wk_err
session_check_contract(const ctl_session_request *req, const ctl_session_binding *b,
                       ctl_session_reason *reason, size_t *off, wk_diag *d)
{
    const ctl_session_hdrs *h = req->hdrs;
    session_text *t = NULL;
    size_t k = b->n_msgs, n_t = 0;
    const char *reply;
    size_t reply_len, a_n, v_n;
    char hex[WK_SHA256_HEX_LEN];
    bool ok;
    wk_err err;

    *reason = CTL_SESSION_REASON_NONE;
    if (b->contract != CTL_SESSION_CONTRACT_PARENT_TOKEN_V1) {
        *reason = CTL_SESSION_REASON_CONTRACT_MISMATCH;
        return WK_OK;
    }
    if (!b->has_meta || b->last_assistant_id == NULL || b->last_user_id == NULL) {
        *reason = CTL_SESSION_REASON_REQUEST_METADATA_UNAVAILABLE;
        return WK_OK;
    }
    if (!b->has_history || b->visible == NULL) {
        *reason = CTL_SESSION_REASON_SESSION_HISTORY_UNAVAILABLE;
        return WK_OK;
    }
    if (strcmp(h->parent_msg_id, b->last_assistant_id) != 0) {
        *reason = CTL_SESSION_REASON_PARENT_MESSAGE_MISMATCH;
        return WK_OK;
    }
    if (session_used(b, h->assistant_msg_id)) {
        *reason = CTL_SESSION_REASON_ASSISTANT_MESSAGE_REUSED;
        return WK_OK;
    }
    if (session_used(b, h->user_msg_id)) {
        *reason = CTL_SESSION_REASON_USER_MESSAGE_REUSED;
        return WK_OK;
    }
    if ((err = session_retained_ok(b, &ok)) != WK_OK)
        return err;
    if (!ok) {
        *reason = CTL_SESSION_REASON_RETAINED_HISTORY_MISMATCH;
        return WK_OK;
    }
    if (req->n_msgs < k) {
        *reason = CTL_SESSION_REASON_PRIOR_HISTORY_MISMATCH;
        return WK_OK;
    }
    if ((err = session_clean_all(req->msgs, k, &t, d)) != WK_OK)
        return err;
    n_t = k;
    for (size_t i = 0; i < k; i++) {
        if (strcmp(t[i].role, b->msgs[i].role) != 0 || t[i].len != b->msgs[i].len ||
            memcmp(t[i].s, b->msgs[i].content, t[i].len) != 0) {
            *reason = CTL_SESSION_REASON_PRIOR_HISTORY_MISMATCH;
            goto done;
        }
    }
    if (req->n_msgs == k || req->msgs[k].role == NULL ||
        strcmp(req->msgs[k].role, "assistant") != 0) {
        *reason = CTL_SESSION_REASON_PRIOR_ASSISTANT_MISSING;
        goto done;
    }
    session_msg_text(&req->msgs[k], &reply, &reply_len);
    {
        char *av = NULL, *vv = NULL;
        err = session_visible_dup(reply, reply_len, &av, &a_n);
        if (err == WK_OK)
            err = session_visible_dup(b->visible, b->visible_len, &vv, &v_n);
        bool same = err == WK_OK && a_n == v_n && memcmp(av, vv, a_n) == 0;
        free(av);
        free(vv);
        if (err != WK_OK)
            goto done;
        if (!same) {
            *reason = CTL_SESSION_REASON_PRIOR_ASSISTANT_MISMATCH;
            goto done;
        }
    }
    err = session_digest(t, k, reply, reply_len, hex, NULL);
    if (err == WK_ENOMEM)
        goto done;
    if (err != WK_OK || strcmp(hex, b->history_digest) != 0) {
        err = WK_OK; /* a text with no JSON form can't match a stored digest */
        *reason = CTL_SESSION_REASON_PARENT_HISTORY_DIGEST_MISMATCH;
        goto done;
    }
    if (req->n_msgs == k + 1) {
        *reason = CTL_SESSION_REASON_NEW_MESSAGES_MISSING;
        goto done;
    }
    if (!session_align_ok(req, b, k, off)) {
        *reason = CTL_SESSION_REASON_TEMPLATE_PREFIX_MISMATCH;
        goto done;
    }
    if (*off >= session_prompt_extent(req))
        *reason = CTL_SESSION_REASON_CONTINUATION_EMPTY;
done:
    session_texts_free(t, n_t);
    return err;
}

/* The exact-prefix checks. Sets *reason (NONE: hit) and *off. */
static wk_err
session_check_prefix(const ctl_session_request *req, const ctl_session_binding *b,
                     ctl_session_reason *reason, size_t *off)
{
    bool ok;
    wk_err err;

    *reason = CTL_SESSION_REASON_NONE;
    if (b->contract != CTL_SESSION_CONTRACT_EXACT_PREFIX) {
        *reason = CTL_SESSION_REASON_CONTRACT_MISMATCH;
        return WK_OK;
    }
    if ((err = session_retained_ok(b, &ok)) != WK_OK)
        return err;
    if (!ok)
        *reason = CTL_SESSION_REASON_RETAINED_HISTORY_MISMATCH;
    else if (!session_prefix_ok(req, b, off))
        *reason = CTL_SESSION_REASON_TEMPLATE_PREFIX_MISMATCH;
    else if (*off >= session_prompt_extent(req))
        *reason = CTL_SESSION_REASON_CONTINUATION_EMPTY;
    return WK_OK;
}

wk_err
ctl_session_validate(const ctl_session_request *req, const ctl_session_binding *b,
                     ctl_session_result *res, wk_diag *d)
{
    ctl_session_result r = {0};
    ctl_session_reason reason = CTL_SESSION_REASON_NONE;
    size_t off = 0;
    wk_err err = WK_OK;

    if (req == NULL || req->hdrs == NULL || res == NULL || (req->msgs == NULL && req->n_msgs) ||
        (req->prompt_ids == NULL && req->n_prompt))
        return wk_diag_set(d, WK_EINVAL, "session validate: NULL argument");
    for (size_t i = 0; i < req->n_msgs; i++) {
        if (req->msgs[i].role == NULL)
            return wk_diag_set(d, WK_EINVAL, "message %zu: missing role", i);
    }
    switch (ctl_session_hdrs_mode(req->hdrs)) {
    case CTL_SESSION_MODE_NONE:
        r.outcome = CTL_SESSION_OUTCOME_NONE;
        break;
    case CTL_SESSION_MODE_PARENT_TOKEN:
        if (req->hdrs->parent_msg_id[0] == '\0') {
            r.outcome = CTL_SESSION_OUTCOME_FIRST;
            r.retire = b != NULL;
        } else if (b == NULL) {
            r.outcome = CTL_SESSION_OUTCOME_MISS;
        } else {
            err = session_check_contract(req, b, &reason, &off, d);
            if (err != WK_OK)
                return err;
            r.outcome = reason == CTL_SESSION_REASON_NONE ? CTL_SESSION_OUTCOME_HIT
                                                          : CTL_SESSION_OUTCOME_REJECTED;
        }
        break;
    case CTL_SESSION_MODE_EXACT_PREFIX:
        if (b == NULL) {
            r.outcome = CTL_SESSION_OUTCOME_PREFIX_MISS;
        } else {
            err = session_check_prefix(req, b, &reason, &off);
            if (err != WK_OK)
                return err;
            r.outcome = reason == CTL_SESSION_REASON_NONE ? CTL_SESSION_OUTCOME_PREFIX_HIT
                                                          : CTL_SESSION_OUTCOME_PREFIX_MISS;
        }
        break;
    }
    r.reason = reason;
    if ((r.outcome == CTL_SESSION_OUTCOME_HIT || r.outcome == CTL_SESSION_OUTCOME_PREFIX_HIT) &&
        req->tok != NULL && req->prompt_text != NULL) {
        r.reused_bytes = off;
        r.reused_tokens = 0;
        /* (World's end-of-text is hidden; a template's eos is text the state consumed) */
        const int32_t eos = req->align != NULL ? -1 : wk_tok_eos(req->tok);
        for (size_t i = 0; i < b->n_retained; i++)
            r.reused_tokens += eos < 0 || b->retained[i] != eos;
    } else if (r.outcome == CTL_SESSION_OUTCOME_HIT ||
               r.outcome == CTL_SESSION_OUTCOME_PREFIX_HIT) {
        r.reused_tokens = off;
    }
    else if (reason != CTL_SESSION_REASON_NONE)
        r.retire = true;
    *res = r;
    return WK_OK;
}

void
ctl_session_result_unavailable(ctl_session_result *res)
{
    switch (res->outcome) {
    case CTL_SESSION_OUTCOME_NONE:
        return;
    case CTL_SESSION_OUTCOME_HIT:
    case CTL_SESSION_OUTCOME_MISS:
        res->outcome = CTL_SESSION_OUTCOME_REJECTED;
        res->reason = CTL_SESSION_REASON_SESSION_UNAVAILABLE;
        break;
    case CTL_SESSION_OUTCOME_PREFIX_HIT:
        res->outcome = CTL_SESSION_OUTCOME_PREFIX_MISS;
        res->reason = CTL_SESSION_REASON_SESSION_UNAVAILABLE;
        break;
    case CTL_SESSION_OUTCOME_PREFIX_MISS:
        if (res->reason == CTL_SESSION_REASON_NONE)
            res->reason = CTL_SESSION_REASON_SESSION_UNAVAILABLE;
        break;
    case CTL_SESSION_OUTCOME_REJECTED:
    case CTL_SESSION_OUTCOME_FIRST:
        break;
    }
    res->reused_tokens = 0;
    res->reused_bytes = 0;
    res->retire = true;
}

const char *
ctl_session_reason_str(ctl_session_reason r)
{
    if ((unsigned)r >= CTL_SESSION_REASON__COUNT)
        return "unknown";
    return session_reason_names[r];
}

const char *
ctl_session_outcome_str(ctl_session_outcome o)
{
    switch (o) {
    case CTL_SESSION_OUTCOME_NONE:
        return "none";
    case CTL_SESSION_OUTCOME_FIRST:
        return "first";
    case CTL_SESSION_OUTCOME_HIT:
        return "hit";
    case CTL_SESSION_OUTCOME_MISS:
        return "miss";
    case CTL_SESSION_OUTCOME_REJECTED:
        return "rejected";
    case CTL_SESSION_OUTCOME_PREFIX_HIT:
        return "prefix_hit";
    case CTL_SESSION_OUTCOME_PREFIX_MISS:
        return "prefix_miss";
    }
    return "unknown";
}

/* ---------------------------------------------------------- commit ---- */

void
ctl_session_binding_free(ctl_session_binding *b)
{
    if (b == NULL)
        return;
    if (b->msgs != NULL) {
        for (size_t i = 0; i < b->n_msgs; i++) {
            free(b->msgs[i].role);
            free(b->msgs[i].content);
        }
        free(b->msgs);
    }
    free(b->prompt);
    free(b->retained);
    free(b->last_assistant_id);
    free(b->last_user_id);
    if (b->used != NULL) {
        for (size_t i = 0; i < b->n_used; i++)
            free(b->used[i]);
        free(b->used);
    }
    free(b->visible);
    free(b->ref);
    free(b);
}

/* Appends a copy of id to b->used unless present, dropping the oldest past the limit. */
static wk_err
session_used_add(ctl_session_binding *b, const char *id)
{
    if (session_used(b, id))
        return WK_OK;
    char *c = session_memdup(id, strlen(id));
    if (c == NULL)
        return WK_ENOMEM;
    if (b->n_used == CTL_SESSION_MAX_USED_IDS) {
        free(b->used[0]);
        memmove(b->used, b->used + 1, (b->n_used - 1) * sizeof(*b->used));
        b->n_used--;
    }
    b->used[b->n_used++] = c;
    return WK_OK;
}

/* WK_EINVAL naming what when an id in ids is outside 0..WK_TOK_MAX_ID. */
static wk_err
session_ids_check(const int32_t *ids, size_t n, const char *what, wk_diag *d)
{
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] > WK_TOK_MAX_ID)
            return wk_diag_set(d, WK_EINVAL, "session commit: %s id %zu out of range (%d)", what, i,
                               (int)ids[i]);
    }
    return WK_OK;
}

wk_err
ctl_session_commit(const ctl_session_turn *t, ctl_session_binding **out, wk_diag *d)
{
    ctl_session_binding *b = NULL;
    wk_err err = WK_OK;

    if (t == NULL || out == NULL || t->req == NULL || t->req->hdrs == NULL || t->res == NULL ||
        (t->req->msgs == NULL && t->req->n_msgs) ||
        (t->req->prompt_ids == NULL && t->req->n_prompt) || (t->gen_ids == NULL && t->n_gen))
        return wk_diag_set(d, WK_EINVAL, "session commit: NULL argument");
    const ctl_session_request *req = t->req;
    const ctl_session_hdrs *h = req->hdrs;
    ctl_session_mode mode = ctl_session_hdrs_mode(h);
    bool hit = t->res->outcome == CTL_SESSION_OUTCOME_HIT ||
               t->res->outcome == CTL_SESSION_OUTCOME_PREFIX_HIT;
    if (mode == CTL_SESSION_MODE_NONE)
        return wk_diag_set(d, WK_EINVAL, "session commit: the request names no chat");
    if (mode == CTL_SESSION_MODE_PARENT_TOKEN &&
        (h->assistant_msg_id[0] == '\0' || h->user_msg_id[0] == '\0'))
        return wk_diag_set(d, WK_EINVAL, "session commit: message ids missing");
    if (hit && (t->prev == NULL || t->res->reused_tokens > req->n_prompt))
        return wk_diag_set(d, WK_EINVAL, "session commit: a hit needs its binding");
    if ((err = session_ids_check(req->prompt_ids, req->n_prompt, "prompt", d)) != WK_OK ||
        (err = session_ids_check(t->gen_ids, t->n_gen, "generated", d)) != WK_OK)
        return err;
    size_t base = hit ? t->prev->n_retained : 0;
    size_t from = hit ? t->res->reused_tokens : 0;
    if (req->n_msgs > CTL_SESSION_MAX_MSGS || req->n_prompt > CTL_SESSION_MAX_TOKENS ||
        base > CTL_SESSION_MAX_TOKENS || t->n_gen > CTL_SESSION_MAX_TOKENS ||
        base + (req->n_prompt - from) + t->n_gen > CTL_SESSION_MAX_TOKENS ||
        (t->visible != NULL && t->visible_len > CTL_SESSION_MAX_TEXT))
        return wk_diag_set(d, WK_ETOOBIG, "session commit: over a session limit");

    b = calloc(1, sizeof(*b));
    if (b == NULL)
        return WK_ENOMEM;
    b->contract = mode == CTL_SESSION_MODE_PARENT_TOKEN ? CTL_SESSION_CONTRACT_PARENT_TOKEN_V1
                                                        : CTL_SESSION_CONTRACT_EXACT_PREFIX;
    b->msgs = calloc(req->n_msgs ? req->n_msgs : 1, sizeof(*b->msgs));
    if (b->msgs == NULL)
        goto nomem;
    for (size_t i = 0; i < req->n_msgs; i++) {
        const wk_chat_msg *m = &req->msgs[i];
        const char *s;
        size_t len;
        if (m->role == NULL || !session_role_valid(m->role, strlen(m->role))) {
            err = wk_diag_set(d, WK_EINVAL, "session commit: message %zu: bad role", i);
            goto fail;
        }
        session_msg_text(m, &s, &len);
        b->n_msgs = i + 1;
        if ((b->msgs[i].role = session_memdup(m->role, strlen(m->role))) == NULL ||
            wk_chat_clean(s, len, &b->msgs[i].content) != WK_OK)
            goto nomem;
        b->msgs[i].len = strlen(b->msgs[i].content);
        if (b->msgs[i].len > CTL_SESSION_MAX_TEXT) {
            err = wk_diag_set(d, WK_ETOOBIG, "session commit: message %zu over the limit", i);
            goto fail;
        }
    }
    b->n_prompt = req->n_prompt;
    b->prompt = malloc((req->n_prompt ? req->n_prompt : 1) * sizeof(int32_t));
    if (b->prompt == NULL)
        goto nomem;
    if (req->n_prompt)
        memcpy(b->prompt, req->prompt_ids, req->n_prompt * sizeof(int32_t));
    b->n_retained = base + (req->n_prompt - from) + t->n_gen;
    b->retained = malloc((b->n_retained ? b->n_retained : 1) * sizeof(int32_t));
    if (b->retained == NULL)
        goto nomem;
    if (base)
        memcpy(b->retained, t->prev->retained, base * sizeof(int32_t));
    if (req->n_prompt > from)
        memcpy(b->retained + base, req->prompt_ids + from,
               (req->n_prompt - from) * sizeof(int32_t));
    if (t->n_gen)
        memcpy(b->retained + base + (req->n_prompt - from), t->gen_ids, t->n_gen * sizeof(int32_t));
    if (wk_sha256_token_ids_hex(b->retained, b->n_retained, b->retained_digest) != WK_OK)
        goto nomem;

    if (mode == CTL_SESSION_MODE_PARENT_TOKEN) {
        b->has_meta = true;
        b->last_assistant_id = session_memdup(h->assistant_msg_id, strlen(h->assistant_msg_id));
        b->last_user_id = session_memdup(h->user_msg_id, strlen(h->user_msg_id));
        b->used = calloc(CTL_SESSION_MAX_USED_IDS, sizeof(*b->used));
        if (b->last_assistant_id == NULL || b->last_user_id == NULL || b->used == NULL)
            goto nomem;
        if (hit && t->prev->contract == CTL_SESSION_CONTRACT_PARENT_TOKEN_V1) {
            for (size_t i = 0; i < t->prev->n_used; i++) {
                if (session_used_add(b, t->prev->used[i]) != WK_OK)
                    goto nomem;
            }
        }
        if (session_used_add(b, h->user_msg_id) != WK_OK ||
            session_used_add(b, h->assistant_msg_id) != WK_OK)
            goto nomem;
    }
    if (t->visible != NULL) {
        session_text *tx = calloc(b->n_msgs ? b->n_msgs : 1, sizeof(*tx));
        if (tx == NULL)
            goto nomem;
        for (size_t i = 0; i < b->n_msgs; i++)
            tx[i] = (session_text){b->msgs[i].role, b->msgs[i].content, b->msgs[i].len};
        err = session_digest(tx, b->n_msgs, t->visible, t->visible_len, b->history_digest, d);
        free(tx);
        if (err != WK_OK)
            goto fail;
        if ((b->visible = session_memdup(t->visible, t->visible_len)) == NULL)
            goto nomem;
        b->visible_len = t->visible_len;
        b->has_history = true;
    }
    *out = b;
    return WK_OK;
nomem:
    err = WK_ENOMEM;
fail:
    ctl_session_binding_free(b);
    return err;
}

const int32_t *
ctl_session_binding_retained(const ctl_session_binding *b, size_t *n)
{
    *n = b->n_retained;
    return b->retained;
}

const char *
ctl_session_binding_retained_digest(const ctl_session_binding *b)
{
    return b->retained_digest;
}

wk_err
ctl_session_binding_set_ref(ctl_session_binding *b, const void *ref, size_t len)
{
    if (len > CTL_SESSION_MAX_REF)
        return WK_ETOOBIG;
    if (len > 0 && ref == NULL)
        return WK_EINVAL;
    uint8_t *c = NULL;
    if (len > 0) {
        c = malloc(len);
        if (c == NULL)
            return WK_ENOMEM;
        memcpy(c, ref, len);
    }
    free(b->ref);
    b->ref = c;
    b->ref_len = len;
    return WK_OK;
}

const void *
ctl_session_binding_ref(const ctl_session_binding *b, size_t *len)
{
    *len = b->ref_len;
    return b->ref;
}

/* ----------------------------------------------------------- bytes ---- */

/* A growable output buffer; oom sticks. */
typedef struct session_wbuf {
    uint8_t *p;  /* bytes */
    size_t len;  /* used */
    size_t cap;  /* allocated */
    bool oom;    /* an allocation failed, or toobig */
    bool toobig; /* the size passed CTL_SESSION_MAX_BLOB */
} session_wbuf;

static void
session_put(session_wbuf *w, const void *p, size_t n)
{
    if (w->oom || n == 0)
        return;
    if (n > CTL_SESSION_MAX_BLOB - w->len) {
        w->oom = w->toobig = true;
        return;
    }
    if (w->len + n > w->cap) {
        size_t nc = w->cap ? w->cap : 1024;
        while (nc < w->len + n)
            nc *= 2;
        uint8_t *np = realloc(w->p, nc);
        if (np == NULL) {
            w->oom = true;
            return;
        }
        w->p = np;
        w->cap = nc;
    }
    memcpy(w->p + w->len, p, n);
    w->len += n;
}

static void
session_put_u32(session_wbuf *w, uint32_t v)
{
    uint8_t le[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    session_put(w, le, 4);
}

static void
session_put_str(session_wbuf *w, const void *s, size_t n)
{
    session_put_u32(w, (uint32_t)n);
    session_put(w, s, n);
}

static void
session_put_ids(session_wbuf *w, const int32_t *ids, size_t n)
{
    session_put_u32(w, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        session_put_u32(w, (uint32_t)ids[i]);
}

wk_err
ctl_session_binding_encode(const ctl_session_binding *b, uint8_t **out, size_t *len, wk_diag *d)
{
    session_wbuf w = {0};
    uint8_t dg[WK_SHA256_LEN];

    if (b == NULL || out == NULL || len == NULL)
        return wk_diag_set(d, WK_EINVAL, "session encode: NULL argument");
    session_put(&w, SESSION_MAGIC, SESSION_MAGIC_LEN);
    session_put_u32(&w, SESSION_VERSION);
    session_put_u32(&w, (b->has_meta ? SESSION_FLAG_META : 0) |
                            (b->has_history ? SESSION_FLAG_HISTORY : 0));
    session_put_u32(&w, b->contract);
    session_put_u32(&w, (uint32_t)b->n_msgs);
    for (size_t i = 0; i < b->n_msgs; i++) {
        session_put_str(&w, b->msgs[i].role, strlen(b->msgs[i].role));
        session_put_str(&w, b->msgs[i].content, b->msgs[i].len);
    }
    session_put_ids(&w, b->prompt, b->n_prompt);
    session_put_ids(&w, b->retained, b->n_retained);
    session_put(&w, b->retained_digest, SESSION_DIGEST_HEX);
    if (b->has_meta) {
        session_put_str(&w, b->last_assistant_id, strlen(b->last_assistant_id));
        session_put_str(&w, b->last_user_id, strlen(b->last_user_id));
    }
    session_put_u32(&w, (uint32_t)b->n_used);
    for (size_t i = 0; i < b->n_used; i++)
        session_put_str(&w, b->used[i], strlen(b->used[i]));
    if (b->has_history) {
        session_put_str(&w, b->visible, b->visible_len);
        session_put(&w, b->history_digest, SESSION_DIGEST_HEX);
    }
    session_put_str(&w, b->ref, b->ref_len);
    if (!w.oom) {
        wk_sha256_buf(w.p, w.len, dg);
        session_put(&w, dg, sizeof(dg));
    }
    if (w.oom) {
        free(w.p);
        if (w.toobig)
            return wk_diag_set(d, WK_ETOOBIG, "session encode: over %u bytes",
                               CTL_SESSION_MAX_BLOB);
        return WK_ENOMEM;
    }
    *out = w.p;
    *len = w.len;
    return WK_OK;
}

/* A bounded reader over hostile bytes. */
typedef struct session_rbuf {
    const uint8_t *p; /* bytes */
    size_t len;       /* readable bytes (the checksum excluded) */
    size_t pos;       /* next byte */
} session_rbuf;

static bool
session_get(session_rbuf *r, size_t n, const uint8_t **p)
{
    if (n > r->len - r->pos)
        return false;
    *p = r->p + r->pos;
    r->pos += n;
    return true;
}

static bool
session_get_u32(session_rbuf *r, uint32_t *v)
{
    const uint8_t *p;
    if (!session_get(r, 4, &p))
        return false;
    *v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return true;
}

/* Reads a str of at most max bytes into a malloc'd NUL-terminated copy. */
static wk_err
session_get_str(session_rbuf *r, size_t max, bool nul_ok, char **out, size_t *len, wk_diag *d,
                const char *what)
{
    uint32_t n;
    const uint8_t *p;
    if (!session_get_u32(r, &n) || n > max || !session_get(r, n, &p))
        return wk_diag_set(d, WK_ECORRUPT, "session binding: bad %s", what);
    if (!nul_ok && memchr(p, 0, n) != NULL)
        return wk_diag_set(d, WK_ECORRUPT, "session binding: NUL in %s", what);
    char *s = session_memdup(p, n);
    if (s == NULL)
        return WK_ENOMEM;
    *out = s;
    if (len != NULL)
        *len = n;
    return WK_OK;
}

/* Reads an id array into a malloc'd copy. */
static wk_err
session_get_ids(session_rbuf *r, int32_t **out, size_t *n_out, wk_diag *d, const char *what)
{
    uint32_t n;
    const uint8_t *p;
    if (!session_get_u32(r, &n) || n > CTL_SESSION_MAX_TOKENS || !session_get(r, (size_t)n * 4, &p))
        return wk_diag_set(d, WK_ECORRUPT, "session binding: bad %s ids", what);
    int32_t *ids = malloc((n ? n : 1) * sizeof(*ids));
    if (ids == NULL)
        return WK_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
                     (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
        if (v > WK_TOK_MAX_ID) {
            free(ids);
            return wk_diag_set(d, WK_ECORRUPT, "session binding: %s id %zu out of range", what, i);
        }
        ids[i] = (int32_t)v;
    }
    *out = ids;
    *n_out = n;
    return WK_OK;
}

/* Reads a 64-digit lowercase hex digest into out. */
static wk_err
session_get_hex(session_rbuf *r, char out[WK_SHA256_HEX_LEN], wk_diag *d, const char *what)
{
    const uint8_t *p;
    if (!session_get(r, SESSION_DIGEST_HEX, &p))
        return wk_diag_set(d, WK_ECORRUPT, "session binding: truncated %s", what);
    memcpy(out, p, SESSION_DIGEST_HEX);
    out[SESSION_DIGEST_HEX] = '\0';
    if (!session_hex_valid(out))
        return wk_diag_set(d, WK_ECORRUPT, "session binding: bad %s", what);
    return WK_OK;
}

/* Reads a message id: 1..CTL_SESSION_HDR_MAX bytes, no NUL. */
static wk_err
session_get_msg_id(session_rbuf *r, char **out, wk_diag *d, const char *what)
{
    size_t n = 0;
    wk_err err = session_get_str(r, CTL_SESSION_HDR_MAX, false, out, &n, d, what);
    if (err == WK_OK && n == 0) {
        free(*out);
        *out = NULL;
        return wk_diag_set(d, WK_ECORRUPT, "session binding: empty %s", what);
    }
    return err;
}

wk_err
ctl_session_binding_decode(const void *buf, size_t len, ctl_session_binding **out, wk_diag *d)
{
    const uint8_t *p = buf;
    uint8_t dg[WK_SHA256_LEN];
    uint32_t version, flags, contract, n;
    session_rbuf r;
    wk_err err = WK_OK;

    if ((buf == NULL && len) || out == NULL)
        return wk_diag_set(d, WK_EINVAL, "session decode: NULL argument");
    if (len < SESSION_MAGIC_LEN + 4 + WK_SHA256_LEN || memcmp(p, SESSION_MAGIC, SESSION_MAGIC_LEN))
        return wk_diag_set(d, WK_ECORRUPT, "session binding: bad magic");
    if (len > CTL_SESSION_MAX_BLOB)
        return wk_diag_set(d, WK_ECORRUPT, "session binding: over %u bytes", CTL_SESSION_MAX_BLOB);
    r = (session_rbuf){p, len - WK_SHA256_LEN, SESSION_MAGIC_LEN};
    if (!session_get_u32(&r, &version))
        return wk_diag_set(d, WK_ECORRUPT, "session binding: truncated");
    if (version != SESSION_VERSION)
        return wk_diag_set(d, WK_ENOTSUP, "session binding: format version %u (expected %u)",
                           version, SESSION_VERSION);
    wk_sha256_buf(p, len - WK_SHA256_LEN, dg);
    if (memcmp(dg, p + len - WK_SHA256_LEN, WK_SHA256_LEN) != 0)
        return wk_diag_set(d, WK_ECORRUPT, "session binding: checksum mismatch");
    if (!session_get_u32(&r, &flags) || !session_get_u32(&r, &contract))
        return wk_diag_set(d, WK_ECORRUPT, "session binding: truncated");
    if ((flags & ~(SESSION_FLAG_META | SESSION_FLAG_HISTORY)) != 0)
        return wk_diag_set(d, WK_ECORRUPT, "session binding: unknown flags 0x%x", flags);
    if (contract != CTL_SESSION_CONTRACT_PARENT_TOKEN_V1 &&
        contract != CTL_SESSION_CONTRACT_EXACT_PREFIX)
        return wk_diag_set(d, WK_ECORRUPT, "session binding: unknown contract %u", contract);

    ctl_session_binding *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return WK_ENOMEM;
    b->contract = contract;
    b->has_meta = (flags & SESSION_FLAG_META) != 0;
    b->has_history = (flags & SESSION_FLAG_HISTORY) != 0;
    /* each message takes at least 8 bytes, so n is bounded by the input too */
    if (!session_get_u32(&r, &n) || n > CTL_SESSION_MAX_MSGS || n > (r.len - r.pos) / 8) {
        err = wk_diag_set(d, WK_ECORRUPT, "session binding: bad message count");
        goto fail;
    }
    b->msgs = calloc(n ? n : 1, sizeof(*b->msgs));
    if (b->msgs == NULL)
        goto nomem;
    for (size_t i = 0; i < n; i++) {
        size_t rl = 0;
        b->n_msgs = i + 1;
        if ((err = session_get_str(&r, 16, false, &b->msgs[i].role, &rl, d, "role")) != WK_OK ||
            (err = session_get_str(&r, CTL_SESSION_MAX_TEXT, false, &b->msgs[i].content,
                                   &b->msgs[i].len, d, "message content")) != WK_OK)
            goto fail;
        if (!session_role_valid(b->msgs[i].role, rl)) {
            err = wk_diag_set(d, WK_ECORRUPT, "session binding: message %zu: bad role", i);
            goto fail;
        }
    }
    if ((err = session_get_ids(&r, &b->prompt, &b->n_prompt, d, "prompt")) != WK_OK ||
        (err = session_get_ids(&r, &b->retained, &b->n_retained, d, "retained")) != WK_OK ||
        (err = session_get_hex(&r, b->retained_digest, d, "retained digest")) != WK_OK)
        goto fail;
    if (b->has_meta &&
        ((err = session_get_msg_id(&r, &b->last_assistant_id, d, "assistant id")) != WK_OK ||
         (err = session_get_msg_id(&r, &b->last_user_id, d, "user id")) != WK_OK))
        goto fail;
    if (!session_get_u32(&r, &n) || n > CTL_SESSION_MAX_USED_IDS) {
        err = wk_diag_set(d, WK_ECORRUPT, "session binding: bad used id count");
        goto fail;
    }
    b->used = calloc(CTL_SESSION_MAX_USED_IDS, sizeof(*b->used));
    if (b->used == NULL)
        goto nomem;
    for (size_t i = 0; i < n; i++) {
        if ((err = session_get_msg_id(&r, &b->used[i], d, "used id")) != WK_OK)
            goto fail;
        b->n_used = i + 1;
    }
    if (b->has_history &&
        ((err = session_get_str(&r, CTL_SESSION_MAX_TEXT, true, &b->visible, &b->visible_len, d,
                                "visible text")) != WK_OK ||
         (err = session_get_hex(&r, b->history_digest, d, "history digest")) != WK_OK))
        goto fail;
    char *ref = NULL;
    if ((err = session_get_str(&r, CTL_SESSION_MAX_REF, true, &ref, &b->ref_len, d, "ref")) !=
        WK_OK)
        goto fail;
    b->ref = (uint8_t *)ref;
    if (b->ref_len == 0) {
        free(b->ref);
        b->ref = NULL;
    }
    if (r.pos != r.len) {
        err = wk_diag_set(d, WK_ECORRUPT, "session binding: %zu trailing bytes", r.len - r.pos);
        goto fail;
    }
    *out = b;
    return WK_OK;
nomem:
    err = WK_ENOMEM;
fail:
    ctl_session_binding_free(b);
    return err;
}
