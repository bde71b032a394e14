/*
 * ctl_resp_req: the request body of POST /v1/responses as a plain value.
 * A pure function over a parsed JSON object: no connection, no model, no
 * store, so it is unit-tested and fuzzed on its own (tests/unit,
 * tests/fuzz). What it accepts and refuses is docs/RESPONSES.md; every
 * refusal names the parameter (OpenAI's error "param") and says why. It
 * never tokenizes, renders or looks a previous response up: ctl_responses
 * does that with the value this returns.
 */
#ifndef CTL_RESP_REQ_H
#define CTL_RESP_REQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wk_err.h"

typedef struct json_t json_t; /* jansson's value, opaque here */

#define CTL_RESP_ID_MAX 64u            /* longest response id ("resp_" + hex), bytes */
#define CTL_RESP_METADATA_MAX 16u      /* metadata pairs (OpenAI's limit) */
#define CTL_RESP_METADATA_KEY_MAX 64u  /* metadata key bytes */
#define CTL_RESP_METADATA_VAL_MAX 512u /* metadata value bytes */
#define CTL_RESP_USER_MAX 256u         /* user / safety_identifier / prompt_cache_key bytes */
#define CTL_RESP_BIAS_MAX 300u         /* logit_bias entries (the chat route's limit) */
#define CTL_RESP_TOOLS_MAX 128u        /* function tools of one request (OpenAI's limit) */
#define CTL_RESP_TOOL_NAME_MAX 64u     /* a function name's bytes */
#define CTL_RESP_CALL_ID_MAX 128u      /* a call_id's bytes */

/* Limits the parser enforces; a zero field takes the default in brackets. */
typedef struct ctl_resp_limits {
    uint32_t max_items;      /* input items [4096] */
    uint64_t max_item_bytes; /* text bytes of one item [4 MiB] */
    uint32_t max_tokens;     /* largest max_output_tokens [65536] */
} ctl_resp_limits;

/* What an input item is. */
typedef enum ctl_resp_kind {
    CTL_RESP_MESSAGE = 0,         /* role and text */
    CTL_RESP_REASONING,           /* text: its reasoning_text parts */
    CTL_RESP_FUNCTION_CALL,       /* call_id, name; text: the arguments (JSON text) */
    CTL_RESP_FUNCTION_CALL_OUTPUT /* call_id; text: the output */
} ctl_resp_kind;

/*
 * One input item: a message (role and its text, text parts concatenated), a
 * reasoning item (role "assistant": the reasoning of the assistant message
 * that follows it), a function call the model made (role "assistant") or
 * its output (role "tool").
 */
typedef struct ctl_resp_msg {
    const char *role;    /* "system" (also for "developer"), "user", "assistant", "tool"; static */
    char *text;          /* NUL-terminated text, owned (ctl_resp_req_fini) */
    size_t len;          /* bytes of text */
    bool reasoning;      /* a reasoning item, not a message (kind CTL_RESP_REASONING) */
    ctl_resp_kind kind;  /* what the item is */
    const char *call_id; /* function_call(_output): borrowed from the body */
    const char *name;    /* function_call: the function's name, borrowed */
} ctl_resp_msg;

/* A parsed request. Strings marked borrowed point into the body JSON. */
typedef struct ctl_resp_req {
    const char *model;                /* borrowed, never NULL after a parse */
    ctl_resp_msg *items;              /* input messages in order, owned */
    size_t n_items;                   /* entries (>= 1) */
    const char *instructions;         /* borrowed; NULL: none */
    size_t instructions_len;          /* bytes */
    const char *previous_response_id; /* borrowed; NULL: none */
    bool store;                       /* keep the response (default true) */
    bool stream;                      /* server-sent events */
    uint32_t max_output_tokens;       /* 0: the server's default */
    bool has_temperature;             /* temperature given */
    double temperature;               /* 0..2 (1 when not given) */
    bool has_top_p;                   /* top_p given */
    double top_p;                     /* 0..1 (1 when not given) */
    bool has_seed;                    /* extension: seed given */
    int64_t seed;                     /* extension: sampling seed */
    bool return_token_ids;            /* extension: the state's token ids in the answer */
    const json_t *logit_bias;         /* extension: borrowed object id -> bias; NULL: none */
    bool has_frequency_penalty;       /* extension: frequency_penalty given */
    double frequency_penalty;         /* -2..2 */
    bool has_presence_penalty;        /* extension: presence_penalty given */
    double presence_penalty;          /* -2..2 */
    const json_t *metadata;           /* borrowed object of string values; NULL: none */
    const json_t *tools;              /* borrowed array of function tools (type "function",
                                         name, parameters); NULL: none */
    bool tool_choice_none;            /* tool_choice "none": the reply is not parsed for calls */
    bool tool_required;               /* tool_choice "required", a named function or allowed_tools
                                         "required": a call is
                                         enforced (constrained decoding, ctl_toolgram) */
    const char *tool_name;            /* borrowed: the named function ({"type": "function",
                                         "name": ...}, one of tools); NULL: any offered one */
    const json_t *allowed_tools;      /* borrowed tool_choice {"type": "allowed_tools", "mode",
                                         "tools"}: a call may name only those (each one of
                                         tools); NULL: any of tools */
    bool allowed_required;            /* allowed_tools with mode "required" (tool_required) */
    bool parallel_tool_calls_off;     /* parallel_tool_calls false: at most one call */
    const char *user;                 /* borrowed; NULL: none */
    const char *reasoning_effort;     /* borrowed reasoning.effort ("none" .. "xhigh"); NULL */
    const char *reasoning_summary;    /* borrowed reasoning.summary (or generate_summary):
                                         "auto", "concise", "detailed"; NULL */
    bool background;                  /* run after answering (needs store, no stream) */
} ctl_resp_req;

/* Why a body was refused. */
typedef struct ctl_resp_err {
    wk_err err;     /* WK_EINVAL (400), WK_ETOOBIG (413-ish limits, sent as 400) */
    char param[96]; /* the parameter, "input[3].content[0].type"; "" none */
    char code[48];  /* OpenAI error code ("unknown_parameter"), "" = the err's */
    char msg[320];  /* human text */
} ctl_resp_err;

/*
 * Parses body (a JSON object, borrowed: *out's borrowed strings point into
 * it, so it must outlive *out) under lim (NULL: defaults). On WK_OK *out is
 * filled and released with ctl_resp_req_fini(); on failure *out is zeroed,
 * *e says why and the return is e->err (WK_EINVAL, WK_ETOOBIG, WK_ENOMEM).
 * Unknown top-level parameters are refused by name. Pure, thread-safe.
 */
WK_MUST_CHECK wk_err ctl_resp_req_parse(const json_t *body, const ctl_resp_limits *lim,
                                        ctl_resp_req *out, ctl_resp_err *e);

/* Frees what r owns and zeroes it. NULL-safe, idempotent. */
void ctl_resp_req_fini(ctl_resp_req *r);

/*
 * True when id has the form of a response id this server makes: "resp_"
 * followed by 1..(CTL_RESP_ID_MAX - 5) bytes of [0-9a-f]. Ids of other
 * forms can name no stored response (and never reach a store key).
 */
bool ctl_resp_id_valid(const char *id);

#endif /* CTL_RESP_REQ_H */
