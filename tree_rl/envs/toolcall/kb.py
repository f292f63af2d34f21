"""A synthetic knowledge base and 1- to 3-hop questions with unique answers, from a seed.

Entities: people, cities, countries and companies with made-up one-word names (people have two).
Relations are functions, so every chain of them from an entity has exactly one answer:

    born_in: person -> city        works_for: person -> company     located_in: city -> country
    capital: country -> city       founded_by: company -> person    based_in: company -> city

Each relation fact is one sentence ("Ana Kor was born in Brisa."). A question follows a chain of
1-3 relations; `needed` lists the facts read along the chain, and `queries` a search query that
retrieves each of them (subject name + the relation's keyword), used by scripted agents and the
process scorer.
"""

from __future__ import annotations

import dataclasses

import numpy as np

RELATIONS = {  # name: (subject type, object type, fact template, query keyword)
    "born_in": ("person", "city", "{s} was born in {o}.", "born"),
    "works_for": ("person", "company", "{s} works for {o}.", "works"),
    "located_in": ("city", "country", "{s} is located in {o}.", "located"),
    "capital": ("country", "city", "The capital of {s} is {o}.", "capital"),
    "founded_by": ("company", "person", "{s} was founded by {o}.", "founded"),
    "based_in": ("company", "city", "{s} is based in {o}.", "based"),
}
CHAINS = [  # (relations, question template)
    (("born_in",), "Where was {x} born?"),
    (("works_for",), "Which company does {x} work for?"),
    (("located_in",), "In which country is the city {x}?"),
    (("capital",), "What is the capital of {x}?"),
    (("founded_by",), "Who founded {x}?"),
    (("based_in",), "In which city is {x} based?"),
    (("born_in", "located_in"), "In which country was {x} born?"),
    (("works_for", "founded_by"), "Who founded the company that {x} works for?"),
    (("works_for", "based_in"), "In which city is the company that {x} works for based?"),
    (("founded_by", "born_in"), "Where was the founder of {x} born?"),
    (("based_in", "located_in"), "In which country is {x} based?"),
    (("capital", "located_in"), "In which country is the capital of {x}?"),
    (("works_for", "founded_by", "born_in"), "Where was the founder of the company that {x} works for born?"),
    (("founded_by", "born_in", "located_in"), "In which country was the founder of {x} born?"),
    (("works_for", "based_in", "located_in"), "In which country is the company that {x} works for based?"),
]
_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr", "sh", "th"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
_CODAS = ["", "", "n", "r", "s", "l", "k", "x"]
_RESERVED = {w.lower().strip("?.") for _, _, t, kw in RELATIONS.values() for w in (t + " " + kw).split()}
_RESERVED |= {w.lower().strip("?.") for _, t in CHAINS for w in t.split()}


@dataclasses.dataclass(frozen=True)
class Question:
  text: str
  answer: str
  hops: int
  needed: tuple[int, ...]     # fact ids along the chain
  queries: tuple[str, ...]    # one search query per hop


@dataclasses.dataclass(frozen=True)
class KnowledgeBase:
  facts: tuple[str, ...]
  entities: dict
  train: tuple[Question, ...]
  test: tuple[Question, ...]

  def split(self, name: str) -> tuple[Question, ...]:
    if name not in ("train", "test"):
      raise ValueError(f"unknown question split {name!r}; known: train, test")
    return getattr(self, name)


def _names(rng, count: int, taken: set) -> list[str]:
  out = []
  while len(out) < count:
    n = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.integers(1, 3)))
    n = (n + rng.choice(_CODAS)).capitalize()
    if len(n) >= 3 and n not in taken and n.lower() not in _RESERVED:
      taken.add(n)
      out.append(n)
  return out


def generate_kb(seed: int = 0, num_people: int = 60, num_cities: int = 30, num_countries: int = 10,
                num_companies: int = 20, num_test: int = 100, min_hops: int = 1, max_hops: int = 3
                ) -> KnowledgeBase:
  """All facts and every (chain, start entity) question with min_hops..max_hops hops, shuffled
  and split into `num_test` test questions and the rest for training (disjoint)."""
  if not 1 <= min_hops <= max_hops <= 3:
    raise ValueError(f"toolcall hops need 1 <= min_hops <= max_hops <= 3, got {min_hops}, {max_hops}")
  if min(num_people, num_cities, num_countries, num_companies) < 1 or num_cities < num_countries:
    raise ValueError("toolcall KB sizes must be >= 1 and num_cities >= num_countries")
  rng = np.random.default_rng(seed)
  taken: set = set()
  firsts, lasts = _names(rng, num_people, taken), _names(rng, num_people, taken)
  ent = {"person": [f"{a} {b}" for a, b in zip(firsts, lasts)],
         "city": _names(rng, num_cities, taken), "country": _names(rng, num_countries, taken),
         "company": _names(rng, num_companies, taken)}
  country_of = np.concatenate([np.arange(num_countries),
                               rng.integers(0, num_countries, num_cities - num_countries)])
  rng.shuffle(country_of)
  rel = {
      "born_in": rng.integers(0, num_cities, num_people),
      "works_for": rng.integers(0, num_companies, num_people),
      "located_in": country_of,
      "capital": np.array([rng.choice(np.flatnonzero(country_of == c)) for c in range(num_countries)]),
      "founded_by": rng.integers(0, num_people, num_companies),
      "based_in": rng.integers(0, num_cities, num_companies),
  }
  facts, fact_id = [], {}
  for r, (stype, otype, tmpl, _) in RELATIONS.items():
    for i, o in enumerate(rel[r]):
      fact_id[(r, i)] = len(facts)
      facts.append(tmpl.format(s=ent[stype][i], o=ent[otype][int(o)]))
  questions = []
  for chain, tmpl in CHAINS:
    if not min_hops <= len(chain) <= max_hops:
      continue
    stype = RELATIONS[chain[0]][0]
    for start in range(len(ent[stype])):
      cur, needed, queries = start, [], []
      for r in chain:
        s_type, o_type, _, kw = RELATIONS[r]
        needed.append(fact_id[(r, cur)])
        queries.append(f"{ent[s_type][cur]} {kw}")
        cur = int(rel[r][cur])
      questions.append(Question(tmpl.format(x=ent[stype][start]), ent[RELATIONS[chain[-1]][1]][cur],
                                len(chain), tuple(needed), tuple(queries)))
  order = rng.permutation(len(questions))
  questions = [questions[i] for i in order]
  if not 0 < num_test < len(questions):
    raise ValueError(f"toolcall num_test must be in [1, {len(questions) - 1}], got {num_test}")
  return KnowledgeBase(tuple(facts), ent, tuple(questions[num_test:]), tuple(questions[:num_test]))
