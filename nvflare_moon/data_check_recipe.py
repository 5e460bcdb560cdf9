"""The data check's recipe, :class:`~nvflare_moon.recipes.data_check.DataCheckRecipe`; this module keeps its import
path."""

from .recipes.data_check import DATA_CHECK_PER_SITE_KEYS, DataCheckRecipe  # noqa: F401 (re-exported)
