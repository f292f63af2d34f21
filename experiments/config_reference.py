"""Write the config reference (docs/config.md) from the config schema.

    python -m experiments.config_reference > docs/config.md
    python -m experiments.config_reference --write      # the same, into docs/config.md

Every field of `tree_rl.config.base_config()` (built after the registries are imported, so the
fields that environments, rollout methods, process scorers and advantage estimators declare are
in it), with its default, its range (`tree_rl.config.RANGES`), its one-line description and the
modules that read it. tests/configs/test_config_reference.py fails when docs/config.md differs
from what this prints.

Descriptions: a declared field's `Field.doc` (`tree_rl.fields.declared`); otherwise the comment
that ends the field's `name=value,` line in `base_config` (tree_rl/config.py) or in the
`fields=dict(...)` of its environment's `register` call, plus the comment-only lines indented
under it; a field with no such comment takes the comment lines right above it.

Readers: a static scan (`ast`) of tree_rl/ and experiments/ for loads of `<x>.<section>.<field>`
(`config.seed` for top-level fields), and of `<alias>.<field>` inside a function that binds
`alias = <x>.<section>`. Reads by subscript, `getattr` or a section passed on as an argument are
not found (a registered component's factory reads its declared fields from the section it is
handed: the module named under "declared by").
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import sys
import tokenize
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCANNED = ("tree_rl", "experiments")
OUT = os.path.join("docs", "config.md")


# ------------------------------------------------------------------------- comments in source

def _comments(source: str) -> dict[int, tuple[int, str, bool]]:
  """{line: (column, text, whether the line holds only the comment)}."""
  out, code_lines = {}, set()
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.COMMENT:
      out[tok.start[0]] = (tok.start[1], tok.string.lstrip("#").strip())
    elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                          tokenize.ENDMARKER):
      code_lines.update(range(tok.start[0], tok.end[0] + 1))
  return {line: (col, text, line not in code_lines) for line, (col, text) in out.items()}


def _keyword_doc(kw: ast.keyword, comments: dict) -> str:
  """The comment ending `kw`'s line plus the comment-only lines indented under it, or else the
  comment-only lines right above it at its own column."""
  parts = []
  trailing = comments.get(kw.end_lineno)
  if trailing and not trailing[2]:
    parts.append(trailing[1])
    line = kw.end_lineno + 1
    while line in comments and comments[line][2] and comments[line][0] > kw.col_offset:
      if not comments[line][1].startswith("(+"):   # a note on the section, not on this field
        parts.append(comments[line][1])
      line += 1
  else:
    line = kw.lineno - 1
    while line in comments and comments[line][2] and comments[line][0] == kw.col_offset:
      parts.insert(0, comments[line][1])
      line -= 1
  return " ".join(parts)


def _dict_keywords(node) -> list[ast.keyword]:
  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
    return [kw for kw in node.keywords if kw.arg]
  return []


def schema_comments(path: str) -> dict[str, str]:
  """{"section.field" or "field": its comment} over `base_config` in `path`."""
  source = open(path).read()
  comments, out = _comments(source), {}
  fn = next(n for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.FunctionDef) and n.name == "base_config")
  for stmt in fn.body:
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Attribute)):
      continue
    name = stmt.targets[0].attr
    kws = _dict_keywords(stmt.value)
    if kws:
      for kw in kws:
        out[f"{name}.{kw.arg}"] = _keyword_doc(kw, comments)
    else:
      kw = ast.keyword(arg=name, value=stmt.value, lineno=stmt.lineno, col_offset=stmt.col_offset,
                       end_lineno=stmt.end_lineno, end_col_offset=stmt.end_col_offset)
      out[name] = _keyword_doc(kw, comments)
  return out


def _python_files() -> list[str]:
  out = []
  for top in SCANNED:
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
      dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
      out += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
  return sorted(out)


def _rel(path: str) -> str:
  return os.path.relpath(path, ROOT).replace(os.sep, "/")


def registration_comments(files) -> dict[str, tuple[str, dict[str, str]]]:
  """{owner: (file, {field: comment})} over `register("owner", ..., fields=dict(...))` calls."""
  out = {}
  for path in files:
    source = open(path).read()
    if "fields=dict(" not in source:
      continue
    comments = _comments(source)
    for node in ast.walk(ast.parse(source)):
      if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
          and isinstance(node.args[0].value, str)):
        for kw in node.keywords:
          if kw.arg == "fields" and _dict_keywords(kw.value):
            out.setdefault(node.args[0].value, (_rel(path), {
                k.arg: _keyword_doc(k, comments) for k in _dict_keywords(kw.value)}))
  return out


def field_sites(files) -> dict[str, list[str]]:
  """{field: files where `field=Field(...)` is written} (where declared fields are declared)."""
  out = defaultdict(list)
  for path in files:
    source = open(path).read()
    if "Field(" not in source:
      continue
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, ast.keyword) and node.arg and isinstance(node.value, ast.Call) and (
          getattr(node.value.func, "id", getattr(node.value.func, "attr", "")) == "Field"):
        if _rel(path) not in out[node.arg]:
          out[node.arg].append(_rel(path))
  return out


# ------------------------------------------------------------------------------------- readers

def readers(files, sections: set[str], top_level: set[str]) -> dict[str, list[str]]:
  """{"section.field" or "field": the files that read it} (module docstring: how)."""
  found = defaultdict(set)
  for path in files:
    tree = ast.parse(open(path).read())
    scopes = [tree] + [n for n in ast.walk(tree)
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    for scope in scopes:
      aliases = {}
      for node in ast.walk(scope):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Attribute)
            and node.value.attr in sections):
          aliases[node.targets[0].id] = node.value.attr
      for node in ast.walk(scope):
        if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)):
          continue
        base = node.value
        if isinstance(base, ast.Attribute) and base.attr in sections:
          found[f"{base.attr}.{node.attr}"].add(_rel(path))
        elif isinstance(base, ast.Name) and base.id in aliases:
          found[f"{aliases[base.id]}.{node.attr}"].add(_rel(path))
        if node.attr in top_level and (
            isinstance(base, ast.Name) and base.id == "config"
            or isinstance(base, ast.Attribute) and base.attr == "config"):
          found[node.attr].add(_rel(path))
  return {k: sorted(v) for k, v in found.items()}


# -------------------------------------------------------------------------------------- render

def _cell(text: str) -> str:
  return text.replace("|", "\\|").replace("\n", " ")


def _value(v) -> str:
  if isinstance(v, (list, tuple)):
    v = tuple(v)
  return "`" + _cell(repr(v)) + "`"


def render() -> str:
  from tree_rl import config as config_lib, fields as fields_lib

  schema = config_lib.base_config()
  files = _python_files()
  comments = schema_comments(os.path.join(ROOT, "tree_rl", "config.py"))
  registered = registration_comments(files)
  sites = field_sites(files)
  sections = [k for k in schema.keys() if hasattr(schema[k], "keys")]
  top = [k for k in schema.keys() if k not in sections]
  read = readers(files, set(sections), set(top))

  lines = [
      "# Config reference",
      "",
      "Generated by `python -m experiments.config_reference --write` from the config schema",
      "(`tree_rl.config.base_config()`, built after the environment, rollout-method, scorer and",
      "estimator registries are imported); `tests/configs/test_config_reference.py` fails when this",
      "page is stale. Override any field with `--config.<section>.<field>=value`; a config file",
      "(`configs/*.py`) starts from these defaults and sets its own.",
      "",
      "- **default**: the value in `base_config()`; **range**: `tree_rl.config.RANGES`, checked",
      "  before a run starts.",
      "- **description**: a declared field's `Field` doc (`tree_rl.fields`), else the comment on",
      "  the field's line in `base_config` (tree_rl/config.py) or in its environment's `register`",
      "  call.",
      "- **declared by**: the registered components that add the field to its section (empty for",
      "  the fields of `base_config` itself).",
      "- **read in**: found by a static scan of `tree_rl/` and `experiments/` for loads of",
      "  `<x>.<section>.<field>` (`config.<field>` for top-level fields) and of `<alias>.<field>`",
      "  in a function that binds `alias = <x>.<section>`. Reads by subscript, by `getattr` or",
      "  through a section passed on as an argument are not found: a registered component's",
      "  factory receives `config.<section>` and reads its declared fields in the module named",
      "  under **declared by**, which this column does not repeat.",
      "",
  ]
  if top:
    lines += ["## Top level", "", "| field | default | range | description | read in |",
              "|---|---|---|---|---|"]
    for name in top:
      lines.append(_row(name, schema[name], config_lib, comments.get(name, ""), None,
                        read.get(name, [])))
    lines.append("")
  for section in sections:
    declared = fields_lib.declared(section)
    lines += [f"## `{section}`", "",
              "| field | default | range | description | declared by | read in |",
              "|---|---|---|---|---|---|"]
    for name in schema[section].keys():
      key = f"{section}.{name}"
      owners = None
      if name in declared:
        owners, f = declared[name]
        doc = f.doc or next((registered[o][1].get(name, "") for o in owners if o in registered), "")
        where = sorted({registered[o][0] for o in owners if o in registered} | set(sites.get(name, [])))
        owners = (", ".join(owners), where)
      else:
        doc = comments.get(key, "")
      lines.append(_row(key, schema[section][name], config_lib, doc, owners, read.get(key, [])))
    lines.append("")
  return "\n".join(lines)


def _row(key, default, config_lib, doc, owners, read_in) -> str:
  spec = config_lib.RANGES.get(key, "")
  cells = [f"`{key}`", _value(default), _cell(config_lib.describe(spec)) if spec else "",
           _cell(doc)]
  if owners is not None or "." in key:
    cells.append(_cell(f"{owners[0]} ({', '.join(owners[1])})" if owners and owners[1]
                       else owners[0] if owners else ""))
  cells.append(", ".join(read_in))
  return "| " + " | ".join(cells) + " |"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--write", action="store_true", help=f"write {OUT} instead of printing")
  args = ap.parse_args(argv)
  text = render()
  if args.write:
    with open(os.path.join(ROOT, OUT), "w") as f:
      f.write(text + "\n")
  else:
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
  main()
