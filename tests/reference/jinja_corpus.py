#!/usr/bin/env python3
"""wk_jinja against Python's jinja2 over llama.cpp's chat-template corpus.

Every template in llama.cpp's models/templates/ (kept by
deploy/install-gguf-converter) is rendered over a fixed set of conversations
(with and without a system message, multi-turn, tool calls and tool results,
reasoning content, content parts, empty content, non-ASCII text), with
add_generation_prompt true and false, enable_thinking true and false where
the template reads it, and tools given or not: once by jinja2 set up exactly
as transformers' apply_chat_template sets it up, once by wkvm-template
--batch (one process for all renders). A render case is equal when both give
the same text, or both fail (raise_exception: with the same message).

Per template the outcome is "equal" (every case equal), "refused" (wk_jinja
refuses the template, or a construct in some case, with WK_ENOTSUP; the
reason is printed) or "mismatched" (anything else). Exit 1 on any mismatch
and on a refusal of a template of a family wkvm serves; 77 when jinja2 or the
corpus cannot be had (no package index).

jinja2 is pinned (JINJA2_PIN) in a small venv cached beside the others:
${XDG_CACHE_HOME:-~/.cache}/wkvm/venv-jinja. Usage (meson runs it):
  jinja_corpus.py WKVM_TEMPLATE_EXE [-v] [-k NAME_SUBSTRING]
"""
import copy
import fcntl
import json
import os
import subprocess
import sys

JINJA2_PIN = ["jinja2==3.1.6", "markupsafe==3.0.2"]
SRC = os.environ.get("WKVM_SOURCE_DIR",
                     os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(
    os.environ.get("HOME", "/tmp"), ".cache"), "wkvm")
VENV = os.environ.get("WKVM_JINJA_VENV", os.path.join(CACHE, "venv-jinja"))

# templates of the families wkvm serves: never refused
SERVED = ["Qwen3.5-4B", "Qwen-Qwen3-0.6B", "NVIDIA-Nemotron-Nano-v2",
          "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "ibm-granite-granite-4.0",
          "ibm-granite-granite-4.1", "llama-cpp-rwkv-world"]


def venv_python():
    """The venv's python with jinja2 pinned; None when pip cannot install it."""
    os.makedirs(os.path.dirname(VENV), exist_ok=True)
    with open(VENV + ".lock", "w") as lock:  # jinja_corpus and jinja_random may run at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _venv_python_locked()


def _venv_python_locked():
    py = os.path.join(VENV, "bin", "python")
    stamp = os.path.join(VENV, "wkvm-pins.txt")
    want = "\n".join(JINJA2_PIN)
    if os.path.exists(stamp) and open(stamp).read() == want and os.path.exists(py):
        return py
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
                       + JINJA2_PIN, stdout=sys.stderr, stderr=sys.stderr)
    if r.returncode != 0:
        return None
    with open(stamp, "w") as f:
        f.write(want)
    return py


def corpus_dir(py):
    d = os.environ.get("WKVM_JINJA_CORPUS")
    if d:
        return d
    r = subprocess.run([os.path.join(SRC, "deploy", "install-gguf-converter"), py],
                       stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    if r.returncode != 0:
        return None
    return os.path.join(r.stdout.strip(), "models", "templates")


TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "description": "Days ahead"},
            },
            "required": ["city"],
        },
    },
}, {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object",
                       "properties": {"query": {"type": "string"},
                                      "tags": {"type": "array", "items": {"type": "string"}}},
                       "required": ["query"]},
    },
}]

CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system": [{"role": "system", "content": "You are a helpful assistant."},
               {"role": "user", "content": "What is 2+2?"}],
    "multi": [{"role": "system", "content": "Be brief."},
              {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello. How can I help?"},
              {"role": "user", "content": "Tell me a joke."}],
    "tools": [{"role": "system", "content": "You can call tools."},
              {"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": "", "tool_calls": [CALL]},
              {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
               "content": "{\"temp\": 20, \"sky\": \"clear\"}"},
              {"role": "assistant", "content": "It is 20 degrees and clear."},
              {"role": "user", "content": "Thanks"}],
    "tools_str": [{"role": "user", "content": "Search for cats"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "abcdefghi", "type": "function",
                       "function": {"name": "search",
                                    "arguments": "{\"query\": \"cats\", \"tags\": [\"a\"]}"}}]},
                  {"role": "tool", "tool_call_id": "abcdefghi", "content": "cats are mammals"}],
    "think_in_content": [{"role": "user", "content": "Hi"},
                         {"role": "assistant",
                          "content": "<think>\nThe user greets.\n</think>\n\nHello!"},
                         {"role": "user", "content": "Bye"}],
    "reasoning": [{"role": "user", "content": "What is 3*3?"},
                  {"role": "assistant", "content": "9",
                   "reasoning_content": "3 times 3 is 9."},
                  {"role": "user", "content": "And 4*4?"}],
    "parts": [{"role": "user", "content": [{"type": "text", "text": "Describe"},
                                           {"type": "text", "text": " this."}]}],
    "empty": [{"role": "system", "content": ""},
              {"role": "user", "content": ""},
              {"role": "assistant", "content": ""},
              {"role": "user", "content": "ok"}],
    "unicode": [{"role": "user",
                 "content": "h\u00e9llo \u2014 \u65e5\u672c\u8a9e \U0001f389 \"q\" 'q'\n\n"
                            "  line\ttab <b>&amp;</b>"}],
}


def cases(src):
    """(conversation name, context) pairs for one template."""
    thinking = [None] + ([True, False] if "enable_thinking" in src else [])
    for name, msgs in CONVERSATIONS.items():
        tool_opts = [None, TOOLS] if name == "user" else [None]
        if name in ("tools", "tools_str"):
            tool_opts = [TOOLS]
        for tools in tool_opts:
            for agp in (True, False):
                for th in thinking:
                    ctx = {"messages": msgs, "tools": tools, "documents": None,
                           "add_generation_prompt": agp, "bos_token": "<s>",
                           "eos_token": "</s>"}
                    if th is not None:
                        ctx["enable_thinking"] = th
                    label = "%s%s agp=%d%s" % (name, "+tools" if tools else "", agp,
                                               "" if th is None else " think=%d" % th)
                    yield label, ctx


def render_jinja2(src, ctxs):
    """Renders src with each context as transformers does; ('ok', text) or ('err', kind, msg)."""
    import jinja2
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from datetime import datetime

    class AssistantTracker(Extension):
        # transformers' {% generation %}: renders its body (tracking is off here)
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_gen"), [], [], body).set_lineno(
                lineno)

        def _gen(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        tpl = env.from_string(src)
    except Exception as e:  # noqa: BLE001 - any compile failure is an outcome
        return [("err", "compile", str(e))] * len(ctxs)
    out = []
    for ctx in ctxs:
        try:
            # a copy: jinja2 can change a context in place (indent's "s += newline" on a list)
            out.append(("ok", tpl.render(**copy.deepcopy(ctx))))
        except jinja2.exceptions.TemplateError as e:
            raise_msg = type(e) is jinja2.exceptions.TemplateError
            out.append(("err", "raise" if raise_msg else type(e).__name__, str(e)))
        except Exception as e:  # noqa: BLE001
            out.append(("err", type(e).__name__, str(e)))
    return out


def main():
    args = sys.argv[1:]
    verbose = "-v" in args
    only = None
    if "-k" in args:
        only = args[args.index("-k") + 1]
    exe = [a for a in args if not a.startswith("-") and a != only][0]
    if os.environ.get("WKVM_JINJA_CHILD") is None:
        py = venv_python()
        if py is None:
            print("jinja_corpus: pip could not install %s, skipping" % " ".join(JINJA2_PIN))
            return 77
        d = corpus_dir(py)
        if d is None or not os.path.isdir(d):
            print("jinja_corpus: no template corpus (deploy/install-gguf-converter failed), "
                  "skipping")
            return 77
        env = dict(os.environ, WKVM_JINJA_CHILD="1", WKVM_JINJA_CORPUS=d)
        return subprocess.run([py, os.path.abspath(__file__)] + args, env=env).returncode

    d = os.environ["WKVM_JINJA_CORPUS"]
    names = sorted(f for f in os.listdir(d) if f.endswith(".jinja"))
    if only:
        names = [n for n in names if only in n]
    plan = []  # (template name, label, ctx, reference)
    for n in names:
        path = os.path.join(d, n)
        src = open(path, encoding="utf-8").read()
        cs = list(cases(src))
        refs = render_jinja2(src, [c for _, c in cs])
        for (label, ctx), ref in zip(cs, refs):
            plan.append((n, path, label, ctx, ref))
    lines = "".join(json.dumps({"template": p, "context": c}) + "\n" for _, p, _, c, _ in plan)
    r = subprocess.run([exe, "--batch"], input=lines.encode(), stdout=subprocess.PIPE,
                       timeout=300)
    got = [json.loads(x) for x in r.stdout.decode().splitlines()]
    if r.returncode != 0 or len(got) != len(plan):
        print("jinja_corpus: wkvm-template --batch failed (rc %d, %d of %d results)"
              % (r.returncode, len(got), len(plan)))
        return 1

    outcome = {}  # template -> ("equal"|"refused"|"mismatched", detail)
    n_cases = {"equal": 0, "both-fail": 0, "refused": 0, "mismatched": 0}
    for (n, _, label, _, ref), res in zip(plan, got):
        kind, detail = None, ""
        if res["ok"]:
            if ref[0] == "ok" and ref[1] == res.get("text"):
                kind = "equal"
            elif ref[0] == "ok":
                kind = "mismatched"
                a, b = ref[1], res.get("text") or ""
                i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]),
                         min(len(a), len(b)))
                detail = "%s: first difference at char %d: jinja2 %r, wkvm %r" % (
                    label, i, a[max(0, i - 30):i + 40], b[max(0, i - 30):i + 40])
            else:
                kind = "mismatched"
                detail = "%s: jinja2 failed (%s: %s), wkvm rendered" % (label, ref[1], ref[2])
        elif res.get("code") == "ENOTSUP" and ref[0] == "ok":
            kind = "refused"
            detail = "%s: %s" % (label, res.get("error"))
        elif ref[0] == "err":
            if ref[1] == "raise" and res.get("stage") == "render" and \
                    res.get("error") != ref[2][:500]:
                kind = "mismatched"
                detail = "%s: raise_exception %r, wkvm %r" % (label, ref[2], res.get("error"))
            else:
                kind = "both-fail"
        else:
            kind = "mismatched"
            detail = "%s: wkvm failed (%s %s), jinja2 rendered" % (
                label, res.get("code"), res.get("error"))
        n_cases[kind] += 1
        if verbose and kind != "equal":
            print("  %s %s: %s %s" % (n, label, kind, detail))
        prev = outcome.get(n, ("equal", ""))
        rank = {"equal": 0, "both-fail": 0, "refused": 1, "mismatched": 2}
        if rank[kind] > rank[prev[0]]:
            outcome[n] = (kind, detail)
        elif n not in outcome:
            outcome[n] = ("equal", "")

    counts = {"equal": 0, "refused": 0, "mismatched": 0}
    for n in names:
        kind, detail = outcome.get(n, ("equal", ""))
        counts[kind] += 1
        if kind != "equal":
            print("%-12s %s: %s" % (kind, n, detail))
    print("jinja_corpus: %d templates: %d rendered equal, %d refused, %d mismatched"
          % (len(names), counts["equal"], counts["refused"], counts["mismatched"]))
    print("jinja_corpus: %d render cases: %d equal, %d failing in both, %d refused, "
          "%d mismatched" % (len(plan), n_cases["equal"], n_cases["both-fail"],
                             n_cases["refused"], n_cases["mismatched"]))
    bad_served = [n for n in names if n[:-len(".jinja")] in SERVED and outcome[n][0] != "equal"]
    missing = [s for s in SERVED if not only and s + ".jinja" not in names]
    if bad_served:
        print("jinja_corpus: FAIL: templates of served families not rendered equal: "
              + ", ".join(bad_served))
    if missing:
        print("jinja_corpus: FAIL: served family templates missing from the corpus: "
              + ", ".join(missing))
    return 1 if counts["mismatched"] or bad_served or missing else 0


if __name__ == "__main__":
    sys.exit(main())
