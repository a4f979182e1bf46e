"""Shared pytest configuration: hypothesis profiles sized for a 2-core CPU."""
import os

from hypothesis import HealthCheck, settings

# JAX compile time dominates; example counts are kept small and deadlines off.
settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
settings.register_profile(
    "thorough", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
