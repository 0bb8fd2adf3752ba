"""YAML for config files: ``safe_load`` plus the refusals that ``safe_load`` lacks.

``safe_load`` builds no arbitrary objects, but it still lets a config file hurt: an alias
bomb ("billion laughs") is a few lines that expand to a billion values when the config is
copied or saved, a key written twice silently keeps only the second value, and absurd nesting
ends in a RecursionError traceback. Here each of those is a one-line `ConfigError` naming the
line, found before anything is built. Anchors, aliases and merge keys (``<<: *defaults``) stay
usable within sane limits.
"""

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from hpcddp.errors import ConfigError

MAX_DEPTH = 64  # sections nest two deep; 64 leaves room for any real kwargs
MAX_VALUES = 100_000  # values after every alias is expanded; real configs have hundreds
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _ConfigLoader(yaml.SafeLoader):
    """A SafeLoader that refuses deep nesting and duplicate keys while it reads."""

    source = ""
    depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise _refusal(
                self.source,
                mark,
                f"nests deeper than {MAX_DEPTH} levels",
                "flatten the structure; a config needs only section.key: value",
            )
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE_TAG:
                continue
            key = (key_node.tag, key_node.value)
            if key in seen:
                raise _refusal(
                    self.source,
                    key_node.start_mark,
                    f"has the key {key_node.value!r} twice (first at line {seen[key] + 1})",
                    "keep one of them; YAML would silently use the last",
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _refusal(source: str, mark: Any, what: str, fix: str) -> ConfigError:
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return ConfigError(f"config {source}{where} {what}. HINT: {fix}.")


def expanded_size(node: Node, limit: int = MAX_VALUES) -> int:
    """How many values ``node`` holds once every alias is expanded (counting stops past limit)."""
    sizes: dict[int, int] = {}

    def size(current: Node) -> int:
        if id(current) in sizes:
            return sizes[id(current)]
        total = 1
        if isinstance(current, SequenceNode):
            total += sum(size(child) for child in current.value)
        elif isinstance(current, MappingNode):
            total += sum(size(k) + size(v) for k, v in current.value)
        sizes[id(current)] = min(total, limit + 1)
        return sizes[id(current)]

    return size(node)


def load(text: str, source: str) -> Any:
    """The document in ``text`` as plain data, or a ConfigError naming what is wrong and where."""
    loader = _ConfigLoader(text)
    loader.source = source
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if expanded_size(node) > MAX_VALUES:
            raise _refusal(
                source,
                node.start_mark,
                f"expands to more than {MAX_VALUES} values through its aliases (an alias bomb?)",
                "write the values out, or use fewer nested aliases",
            )
        return loader.construct_document(node)
    except RecursionError:
        raise _refusal(source, None, "nests too deep to read", "flatten the structure") from None
    finally:
        loader.dispose()
