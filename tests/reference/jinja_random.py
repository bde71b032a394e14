#!/usr/bin/env python3
"""wk_jinja against Python's jinja2 on generated templates.

Two fixed-seed generators (so a failure reproduces): expressions over a
context of every JSON type (operators, filters, tests, str/dict/list
methods, subscripts, slices, conditional expressions), and chat-template-like
statement soups (if/elif/else, for with filters, slices and else, set, block
set, namespace attributes, macros, break, comments) with random whitespace
control and blank text around every tag. Each template is rendered by jinja2
set up as transformers sets it up (tests/reference/jinja_corpus.py) and by
wkvm-template --batch; a case passes when both give the same text, both fail,
or wk_jinja refuses a construct by name (WK_ENOTSUP). Exit 1 on any other
outcome, 77 when jinja2 cannot be had.

Usage (meson runs it): jinja_random.py WKVM_TEMPLATE_EXE [N_EXPR N_STMT SEED]
"""
import copy
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jinja_corpus  # noqa: E402

CTX = {"s": "Hello, World", "e": "", "u": "h\u00e9llo \u65e5\u672c \u00ff", "ws": "  a b\n c  ",
       "i": 7, "z": 0, "neg": -3, "f": 2.5, "g": 1e-7, "t": True, "fa": False, "n": None,
       "l": [3, 1, 2], "ls": ["b", "a", "C"], "el": [],
       "ld": [{"name": "x", "v": 1}, {"name": "y", "v": 2}],
       "d": {"b": 1, "a": [1, 2], "c": {"k": "v"}}, "ed": {},
       "msgs": [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yo",
                 "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]}]}
SLICEABLE = ["s", "e", "u", "ws", "l", "ls", "el", "ld", "msgs", "i", "n", "t", "d", "undef"]
VARS = list(CTX) + ["undef"]
LITS = ["1", "0", "-2", "2.0", "0.5", "'a'", "''", "'x,y'", "' p '", "none", "true", "false",
        "[1, 'a']", "[]", "{'k': 1}", "(1, 2)", "'\\n'", "3", "'ab'", "'\u00c9t\u00e9'"]
FILTERS = ["length", "trim", "string", "upper", "lower", "list", "first", "last", "tojson",
           "join", "join(', ')", "default('D')", "default('D', true)", "items|list", "dictsort",
           "sort", "unique|list", "reverse|list", "int", "float", "abs", "round", "capitalize",
           "title", "replace('l', 'L')", "map(attribute='name')|list", "selectattr('v')|list",
           "rejectattr('name', 'equalto', 'x')|list", "select|list", "reject|list",
           "tojson(indent=2)", "tojson(sort_keys=true)", "indent(2)", "count", "sum", "min",
           "max", "wordcount", "safe", "e", "trim('l')", "map('string')|list",
           "map('upper')|join", "d", "list|length", "tojson(ensure_ascii=true)"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
         "iterable", "sequence", "boolean", "true", "false", "odd", "even", "divisibleby(3)",
         "in([1, 'a'])", "equalto 1", "eq('a')", "lower", "upper", "gt 1", "lt(2)",
         "sameas none"]
METHODS = ["strip()", "strip('H')", "lstrip()", "rstrip('d')", "split()", "split(',')",
           "split(' ', 1)", "splitlines()", "startswith('He')", "endswith(('d', 'x'))",
           "replace('o', '0')", "upper()", "lower()", "title()", "capitalize()", "find('o')",
           "count('l')", "get('a')", "get('zz', 5)", "items()|list", "keys()|list",
           "values()|list", "format(1)", "isdigit()", "index(1)", "rsplit(',', 1)"]
BINOPS = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", ">", "<=", ">=", "in",
          "not in", "and", "or"]


def gen_expr(rnd):
    def atom(d):
        r = rnd.random()
        if r < 0.45:
            return rnd.choice(VARS)
        if r < 0.8:
            return rnd.choice(LITS)
        return "(" + expr(d + 1) + ")"

    def expr(d=0):
        if d > 3:
            return atom(d)
        r = rnd.random()
        if r < 0.25:
            return atom(d)
        if r < 0.45:
            return atom(d) + " " + rnd.choice(BINOPS) + " " + atom(d)
        if r < 0.6:
            return atom(d) + "|" + rnd.choice(FILTERS)
        if r < 0.7:
            return atom(d) + " is " + rnd.choice(["", "not "]) + rnd.choice(TESTS)
        if r < 0.8:
            return atom(d) + "." + rnd.choice(METHODS)
        if r < 0.88:
            a = rnd.choice(["", "1", "-1", "-2"])
            b = rnd.choice(["", "2", "-1", "5"])
            c = rnd.choice(["", "", "-1", "2"])
            return rnd.choice(SLICEABLE) + "[" + a + ":" + b + (":" + c if c else "") + "]"
        if r < 0.94:
            return atom(d) + "[" + rnd.choice(["0", "-1", "'a'", "'name'", "1", "5"]) + "]"
        if r < 0.97:
            return "not " + atom(d)
        return atom(d) + " if " + atom(d) + " else " + atom(d)

    return "{{ " + expr() + " }}|{{ " + expr() + " }}"


SCTX = {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi there"},
                     {"role": "assistant", "content": "<think>r</think>ok",
                      "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
                     {"role": "user", "content": [{"type": "text", "text": "p"}]}],
        "tools": [{"function": {"name": "f", "parameters": {"properties": {"a": {"type": "int"}}}}}],
        "add_generation_prompt": True, "n": None, "k": 2,
        "m": {"role": "user", "content": "top"}, "t": {"function": {"name": "g"}},
        "x": "X", "y": "Y"}
WS = ["", "", "\n", "  ", "\n  ", "x\n", " \t\n\n ", "\n\n", "a b", "  \n"]
SEXPRS = ["m.role", "m.content", "loop.index if loop is defined", "ns.c", "x", "k",
          "m.content is string", "messages|length", "m.tool_calls is defined",
          "(m.content if m.content is string else m.content|map(attribute='text')|join)",
          "m.content.split('</think>')[-1]", "t.function.name", "tools|tojson", "y",
          "(loop.previtem.role if loop.previtem is defined else '-') if loop is defined",
          "caller is defined", "ns.c ~ '/'", "m.get('role')",
          "loop.revindex0 if loop is defined else 'nl'"]
CONDS = ["m.role == 'user'", "loop is defined and loop.first", "loop is defined and loop.last",
         "loop is not defined or not loop.first", "m.content is string", "x", "ns.c > 1",
         "k is odd", "m.tool_calls is defined", "tools", "n is none", "add_generation_prompt"]


def gen_stmts(rnd):
    def tag(s):
        return "{%" + rnd.choice(["", "-", "", "+"]) + " " + s + " " + \
            rnd.choice(["", "-", "", "+"]) + "%}"

    def body(d):
        out = []
        for _ in range(rnd.randint(1, 4)):
            out.append(rnd.choice(WS))
            r = rnd.random()
            if r < 0.3 or d > 2:
                out.append("{{" + rnd.choice(["", "-"]) + " " + rnd.choice(SEXPRS) + " " +
                           rnd.choice(["", "-"]) + "}}")
            elif r < 0.45:
                out.append(tag("if " + rnd.choice(CONDS)) + body(d + 1) +
                           (tag("elif " + rnd.choice(CONDS)) + body(d + 1)
                            if rnd.random() < 0.3 else "") +
                           (tag("else") + body(d + 1) if rnd.random() < 0.4 else "") +
                           tag("endif"))
            elif r < 0.6:
                out.append(tag("for m in messages" + rnd.choice(
                    ["", " if m.role != 'system'", "[1:]", "|reverse"])) + body(d + 1) +
                    (tag("else") + "E" if rnd.random() < 0.2 else "") + tag("endfor"))
            elif r < 0.68:
                out.append(tag("set x = " + rnd.choice(SEXPRS)))
            elif r < 0.76:
                out.append(tag("set ns.c = ns.c + 1"))
            elif r < 0.8:
                out.append("{#" + rnd.choice(["", "-"]) + " c " + rnd.choice(["", "-"]) + "#}")
            elif r < 0.85:
                out.append(tag("for t in tools") + body(d + 1) + tag("endfor"))
            elif r < 0.9:
                out.append(tag("if loop is defined and loop.index > 1") + tag("break") +
                           tag("endif"))
            elif r < 0.95:
                out.append(tag("set y") + body(d + 1) + tag("endset") + "[{{ y }}]")
            else:
                out.append("{{ mac(" + rnd.choice(["1", "'a'", "x", ""]) + ") }}")
            out.append(rnd.choice(WS))
        return "".join(out)

    pre = tag("set ns = namespace(c=0)") + rnd.choice(WS) + tag("macro mac(v='d')") + \
        "<{{ v }}{{ ns.c }}>" + tag("endmacro") + rnd.choice(WS)
    return pre + body(0) + rnd.choice(WS)


def main():
    args = sys.argv[1:]
    if os.environ.get("WKVM_JINJA_CHILD") is None:
        py = jinja_corpus.venv_python()
        if py is None:
            print("jinja_random: pip could not install %s, skipping"
                  % " ".join(jinja_corpus.JINJA2_PIN))
            return 77
        env = dict(os.environ, WKVM_JINJA_CHILD="1")
        return subprocess.run([py, os.path.abspath(__file__)] + args, env=env).returncode
    exe = args[0]
    n_expr = int(args[1]) if len(args) > 1 else 1200
    n_stmt = int(args[2]) if len(args) > 2 else 500
    seed = int(args[3]) if len(args) > 3 else 29
    rnd = random.Random(seed)
    cases = [(gen_expr(rnd), CTX) for _ in range(n_expr)] + \
            [(gen_stmts(rnd), SCTX) for _ in range(n_stmt)]
    with tempfile.TemporaryDirectory(prefix="jinja_random.") as tmp:
        lines = []
        for k, (tpl, ctx) in enumerate(cases):
            path = os.path.join(tmp, "%d.jinja" % k)
            with open(path, "w", encoding="utf-8") as f:
                f.write(tpl)
            lines.append(json.dumps({"template": path, "context": ctx}) + "\n")
        refs = [jinja_corpus.render_jinja2(tpl, [copy.deepcopy(ctx)])[0] for tpl, ctx in cases]
        r = subprocess.run([exe, "--batch"], input="".join(lines).encode(),
                           stdout=subprocess.PIPE, timeout=300)
    got = [json.loads(x) for x in r.stdout.decode().splitlines()]
    if r.returncode != 0 or len(got) != len(cases):
        print("jinja_random: wkvm-template --batch failed (rc %d, %d of %d results)"
              % (r.returncode, len(got), len(cases)))
        return 1
    counts = {"equal": 0, "both-fail": 0, "refused": 0, "mismatched": 0}
    for (tpl, _), ref, res in zip(cases, refs, got):
        if res["ok"] and ref[0] == "ok" and res.get("text") == ref[1]:
            kind = "equal"
        elif not res["ok"] and ref[0] == "err":
            kind = "both-fail"
        elif not res["ok"] and res.get("code") == "ENOTSUP":
            kind = "refused"
        else:
            kind = "mismatched"
            if counts["mismatched"] < 10:
                print("mismatched %r\n  jinja2: %r\n  wkvm:   %r" % (
                    tpl, ref[1] if ref[0] == "ok" else ref[1:],
                    res.get("text") if res["ok"] else (res.get("code"), res.get("error"))))
        counts[kind] += 1
    print("jinja_random: seed %d, %d templates: %d equal, %d failing in both, %d refused, "
          "%d mismatched" % (seed, len(cases), counts["equal"], counts["both-fail"],
                             counts["refused"], counts["mismatched"]))
    return 1 if counts["mismatched"] else 0


if __name__ == "__main__":
    import warnings
    warnings.simplefilter("ignore", SyntaxWarning)  # jinja2's generated code on literal[...]
    sys.exit(main())
