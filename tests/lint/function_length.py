#!/usr/bin/env python3
"""No function in src/ over 100 lines.

Finds the C and CUDA function definitions (a top-level brace block whose opening brace follows a
`)`, possibly with C++ qualifiers between) in the .c, .h, .cu and .cuh files below the folders
given (default: src/ next to this script's tests/), and prints each one longer than --max lines
(from the line of its name to its closing brace) as `file:line: name: N lines`. Exits 1 if there
is any, else 0.

--self-test: runs the checker on generated files, one with a function of max + 1 lines (it must
be found) and one of exactly max lines (it must not), and exits 0 only if both come out so.
"""
import argparse
import os
import re
import sys
import tempfile

EXTS = (".c", ".h", ".cu", ".cuh")
# blocks that hold definitions rather than being one: extern "C" { ... } (its string blanked by
# strip), namespace x { ... }
TRANSPARENT = re.compile(r'(?:\bextern\s*"\s*"|\bnamespace(?:\s+\w+)?)\s*$')
QUALIFIERS = re.compile(r"\)\s*(?:(?:const|noexcept|override|final)\s*)*$")
NAME = re.compile(r"([A-Za-z_]\w*(?:::[A-Za-z_~]\w*)*)\s*(?:<[^<>()]*>\s*)?$")


def strip(text):
    """The text with comments, string and character literals and preprocessor lines blanked
    (newlines kept, so that offsets still give line numbers)."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if line_start and c == "#":  # a directive, with its continuation lines
            j = i
            while j < n and text[j] != "\n":
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 2
                    continue
                if text.startswith("/*", j):  # a comment may run past the directive's line
                    k = text.find("*/", j + 2)
                    j = n if k < 0 else k + 2
                    continue
                j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1 : j - 1]) + c)
            i = j
        else:
            if c == "\n":
                line_start = True
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """(name, first line, last line) of each function definition in C or CUDA source text."""
    s = strip(text)
    found = []
    stack = []  # for each open brace: (kind, offset, name) with kind 'fn', 'pass' or 'other'
    for m in re.finditer(r"[{}]", s):
        pos = m.start()
        if m.group() == "{":
            before = s[:pos]
            inside_fn = any(k != "pass" for k, _, _ in stack)
            if inside_fn:
                stack.append(("other", pos, None))
            elif TRANSPARENT.search(before[-200:]):
                stack.append(("pass", pos, None))
            elif QUALIFIERS.search(before[-200:]):
                close = before.rstrip()
                close = close[: len(close) - len(QUALIFIERS.search(close).group()) + 1]
                # the `(` that matches the last `)`: the name stands before it
                depth, j = 0, len(close) - 1
                while j >= 0:
                    if close[j] == ")":
                        depth += 1
                    elif close[j] == "(":
                        depth -= 1
                        if depth == 0:
                            break
                    j -= 1
                nm = NAME.search(close[:j]) if j > 0 else None
                if nm and nm.group(1) not in ("if", "for", "while", "switch", "sizeof"):
                    stack.append(("fn", nm.start(1), nm.group(1)))
                else:
                    stack.append(("other", pos, None))
            else:
                stack.append(("other", pos, None))
        elif stack:
            kind, start, name = stack.pop()
            if kind == "fn":
                first = s.count("\n", 0, start) + 1
                last = s.count("\n", 0, pos) + 1
                found.append((name, first, last))
    return found


def check(paths, limit, out=sys.stdout):
    """Prints every function longer than `limit` lines below `paths`; returns their count."""
    files = []
    for p in paths:
        if os.path.isfile(p):
            files.append(p)
            continue
        for root, dirs, names in os.walk(p):
            dirs.sort()
            files += [os.path.join(root, f) for f in sorted(names) if f.endswith(EXTS)]
    bad = 0
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for name, first, last in functions(text):
            if last - first + 1 > limit:
                print(f"{f}:{first}: {name}: {last - first + 1} lines (at most {limit})", file=out)
                bad += 1
    return bad


def self_test(limit):
    def body(lines):  # a function of exactly `lines` lines, with traps for the parser
        inner = ["    int x = 0; /* { not a brace */", '    const char *s = "}{";',
                 "    if (x) {", "        x++;", "    }"]
        inner += ["    x += 1;"] * (lines - 2 - len(inner))
        return ["static int f(void) {"] + inner + ["}"]

    ok = True
    with tempfile.TemporaryDirectory() as d:
        for lines, want in ((limit + 1, 1), (limit, 0)):
            p = os.path.join(d, f"f{lines}.c")
            with open(p, "w") as fh:
                fh.write('#include <stdio.h>\nextern "C" {\n')
                fh.write("\n".join(body(lines)) + "\n}\n")
                fh.write("static const int table[] = {1, 2};\n")
            with open(os.devnull, "w") as null:
                got = check([p], limit, out=null)
            if got != want:
                print(f"self-test: a {lines}-line function: {got} reported, want {want}")
                ok = False
    print("self-test: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", help="files or folders (default: the repository's src)")
    ap.add_argument("--max", type=int, default=100, help="the most lines a function may have")
    ap.add_argument("--self-test", action="store_true", help="check the checker")
    a = ap.parse_args()
    if a.self_test:
        return self_test(a.max)
    paths = a.paths or [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                     "src")]
    bad = check(paths, a.max)
    if bad:
        print(f"{bad} function(s) over {a.max} lines: split them")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
