"""MOON (Li, He and Song, CVPR 2021): CE + μ·ℓ_con(z, z_glob, z_prev), with the MOON article's practical options."""

from ..client import PTMoonHelper
from ..core.moon import MoonSettings
from ..executors import MoonExecutor
from ..recipes import MoonRecipe, MoonScriptRecipe
from . import Method

METHOD = Method(
    name="moon",
    label="MOON",
    paper="Li, He and Song, CVPR 2021",
    recipe=MoonRecipe,
    executor=MoonExecutor,
    helper=PTMoonHelper,
    script_recipe=MoonScriptRecipe,
    settings=MoonSettings,
    jobs={
        "moon_cifar10": lambda: MoonRecipe(name="moon_cifar10"),
        "moon_cifar100": lambda: MoonRecipe(name="moon_cifar100", dataset="cifar100", arch="resnet50", mu=1.0),
        "moon_tinyimagenet": lambda: MoonRecipe(
            name="moon_tinyimagenet", dataset="tinyimagenet", arch="resnet50", mu=1.0, num_rounds=20
        ),
        # the paper's scalability settings (CIFAR-100, μ = 10): 50 sites, all trained; 100 sites, 20% sampled per round
        "moon_cifar100_50sites": lambda: MoonRecipe(
            name="moon_cifar100_50sites", dataset="cifar100", arch="resnet50", mu=10.0, min_clients=50, num_rounds=200
        ),
        "moon_cifar100_100sites_sampled": lambda: MoonRecipe(
            name="moon_cifar100_100sites_sampled",
            dataset="cifar100",
            arch="resnet50",
            mu=10.0,
            min_clients=100,
            sample_fraction=0.2,
            num_rounds=500,
        ),
    },
    benchmark={
        "moon": ("MOON", {}),
        "moon_l2": ("ℓ2 penalty", {"representation_loss": "l2"}),
        # the MOON article's practical options (docs/practical_options.md); a protocol's variant sets them
        "moon_cold_start": ("MOON, cold start", {}),
        "moon_feature_noise": ("MOON, noise on h", {}),
        "moon_light_history": ("MOON, light history", {"light_history": True}),
    },
)
