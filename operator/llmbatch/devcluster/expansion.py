"""Kubernetes ``$(VAR)`` expansion, as the kubelet applies it to env values, command and args.

``$(NAME)`` becomes the value of NAME when NAME is defined and stays as written otherwise;
``$$`` escapes a ``$`` (so ``$$(NAME)`` yields the literal ``$(NAME)``). Mirrors
k8s.io/kubernetes/third_party/forked/golang/expansion.
"""

from __future__ import annotations

from collections.abc import Mapping


def expand(text: str, env: Mapping[str, str]) -> str:
    out: list[str] = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            end = text.find(")", i + 2)
            if end == -1:
                # Unterminated reference: kubelet keeps the text as written.
                out.append(text[i:])
                break
            name = text[i + 2 : end]
            out.append(env[name] if name in env else text[i : end + 1])
            i = end + 1
        else:
            out.append(ch)
            out.append(nxt)
            i += 2
    return "".join(out)
