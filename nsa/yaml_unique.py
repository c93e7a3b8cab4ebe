"""YAML read by ``yaml.safe_load``'s rules, except that a mapping holding a key twice is an error.

PyYAML keeps the last value of a duplicated key without a word: a runbook with ``gates:`` twice in
a phase was judged against the second list alone, a profile with a threshold twice against the
second number, a trainer config with ``lr:`` twice trained with the second. Every YAML file this
project reads as settings goes through ``safe_load_unique``: the trainer's config (nsa/config.py)
and the harness's runbooks, profiles and golden curves (validation/, which may import this
module: it is a leaf of no layer, not the trainer it judges, nsa/train/).

The loader is PyYAML's SafeLoader (no tag of Python objects is constructed) whose documents are
checked before they are constructed: each mapping's keys are compared as YAML constructs them
(``1`` and ``"1"`` differ, ``yes`` and ``true`` do not), with the path of the mapping and the
lines of both keys. A key that a merge (``<<: *anchor``) brings in and the mapping sets again is
YAML's override, not a duplicate.

A number in exponent form without a sign or a dot (``1.0e12``, ``1e-5``) is a float, as YAML 1.2
reads it: PyYAML's YAML 1.1 rules read it as a string, so a threshold written ``1.0e12`` would be
refused as text (or, in a mapping of strings, kept as one).
"""
from __future__ import annotations

import re
from typing import Any

import yaml

_MERGE = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.YAMLError):
    """A key written twice in one mapping."""

    def __init__(self, key: Any, where: str, first_line: int, second_line: int):
        self.key, self.where, self.first_line, self.second_line = key, where, first_line, second_line
        place = f"in {where}" if where else "at the top level"
        super().__init__(f"key {key!r} appears twice {place} (lines {first_line} and {second_line}): YAML would "
                         f"silently keep the second value; remove or merge one")


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_document(self, node: yaml.Node) -> Any:
        self._check(node, "", set())
        return super().construct_document(node)

    def _check(self, node: yaml.Node, where: str, seen: set[int]) -> None:
        if id(node) in seen:  # an alias of a node already checked (or of one that holds itself)
            return
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._check(item, f"{where}[{i}]", seen)
        elif isinstance(node, yaml.MappingNode):
            first: dict[Any, yaml.Node] = {}
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE:
                    self._check(value_node, where, seen)
                    continue
                if not isinstance(key_node, yaml.ScalarNode):  # a complex key: safe_load refuses it as unhashable
                    continue
                key = self.construct_object(key_node, deep=True)
                if key in first:
                    raise DuplicateKeyError(key, where, first[key].start_mark.line + 1, key_node.start_mark.line + 1)
                first[key] = key_node
                name = key if isinstance(key, str) else repr(key)
                self._check(value_node, f"{where}.{name}" if where else name, seen)


# YAML 1.2's float forms that YAML 1.1 reads as strings: an exponent without a sign, or a mantissa
# without a dot; the 1.1 forms still match PyYAML's own resolver first
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789."))


def safe_load_unique(text: str) -> Any:
    """``yaml.safe_load(text)``, raising DuplicateKeyError (a yaml.YAMLError) for a key written
    twice in one mapping."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader: safe_load's constructors
