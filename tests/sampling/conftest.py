"""Fixtures of the sampler tests."""

import pytest

from sampling_helpers import make_model


@pytest.fixture(scope="session")
def model():
  return make_model()
