"""Every MOON, FedSSC and FedSiam-DA option works from the executor and from the Client API helper, with the same
loss on the same batch: both sides run the same round object (nvflare_moon.core), one from the executor's arguments,
the other from the settings a Client API recipe sends in the meta."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from nvflare_moon.client import PTFedSiamDAHelper, PTFedSSCHelper, PTMoonHelper
from nvflare_moon.core.fedsiam_da import FedSiamDASettings
from nvflare_moon.core.fedssc import FedSSCSettings
from nvflare_moon.core.moon import MoonSettings
from nvflare_moon.core.prototypes import PROTOTYPE_AVAILABLE, PROTOTYPES
from nvflare_moon.core.specs import DataSpec, TrainingSpec
from nvflare_moon.core.training import sgd
from nvflare_moon.core.weights import state_dict_to_numpy
from nvflare_moon.executors import FedSiamDAExecutor, FedSSCExecutor, MoonExecutor
from nvflare_moon.models import Network
from nvflare_moon.recipes import FedSiamDAScriptRecipe, FedSSCScriptRecipe, MoonScriptRecipe

from .executor_harness import site_context

MOON_OPTIONS = [
    {},
    {"mu": 1.0, "temperature": 0.2},
    {"num_previous_models": 2},
    {"mu_off_rounds": 1, "mu_ramp_rounds": 2},
    {"representation_loss": "l2"},
    {"representation_loss": "l2_squared"},
    {"feature_noise_std": 0.3},
    {"light_history": True},
]
FEDSSC_OPTIONS = [
    {},
    {"mu_glob": 2.0, "min_class_count": 1},
    {"prototype_clip_norm": 0.5, "min_class_count": 1},
    {"light_history": True, "feature_noise_std": 0.1},
]
FEDSIAM_DA_OPTIONS = [{}, {"mu": 0.5, "history": "round"}, {"history_branch": "predictor"}]
FEDSSC_FIELDS = {"mu_glob", "min_class_count", "prototype_clip_norm", "prototype_noise_std"}


def batch(round_number: int):
    g = torch.Generator().manual_seed(round_number)
    return torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)


def received(model, round_number, meta):
    return SimpleNamespace(params=state_dict_to_numpy(model), current_round=round_number, meta=dict(meta))


def executor_site(cls, tmp_path: Path, **arguments):
    executor = cls(model=Network(seed=0, predictor_hidden_dim=8), data=DataSpec(dataset="synthetic"), **arguments)
    executor._net = executor.model
    return executor, site_context(tmp_path / "executor")


def trained_in_round(round_number):
    """The weights a site 'trained' in a round, and the global model of the next."""
    return Network(seed=10 + round_number, predictor_hidden_dim=8).state_dict()


def executor_losses(executor, ctx, rounds, meta_of=lambda r: {}):
    """The loss of the executor's objective on round r's batch, for each round, after 'training' the round."""
    losses = []
    for r in range(rounds):
        executor.model.load_state_dict(Network(seed=r, predictor_hidden_dim=8).state_dict())
        objective = executor.make_objective(r, ctx, meta_of(r))
        executor.before_epoch(0)
        x, y = batch(r)
        losses.append(objective(executor.model(x), x, y)[0].item())
        executor.model.load_state_dict(trained_in_round(r))
        executor.after_training(r, ctx)
    return losses


def helper_losses(helper, meta, rounds, meta_of=lambda r: {}, optimizer=False):
    """The same rounds through a Client API helper: CE + helper.loss on round r's batch."""
    losses = []
    model = helper.model
    for r in range(rounds):
        model.load_state_dict(Network(seed=r, predictor_hidden_dim=8).state_dict())
        if optimizer:
            helper.start_round(received(model, r, {**meta, **meta_of(r)}), sgd(model, 0.01, 0.9, 1e-5))
            helper.start_epoch(0)
        else:
            helper.start_round(received(model, r, {**meta, **meta_of(r)}))
        x, y = batch(r)
        out = model(x)
        extra = (x, out.projection, y) if isinstance(helper, PTFedSSCHelper) else (x, out.projection)
        losses.append((F.cross_entropy(out.logits, y) + helper.loss(*extra)).item())
        model.load_state_dict(trained_in_round(r))
        helper.save_local_model()
    return losses


def helper_model():
    return Network(seed=0, predictor_hidden_dim=8)


@pytest.mark.parametrize("options", MOON_OPTIONS, ids=lambda o: ",".join(o) or "defaults")
def test_every_moon_option_gives_the_same_losses_from_the_executor_and_the_helper(tmp_path, options):
    executor, ctx = executor_site(MoonExecutor, tmp_path, settings=MoonSettings(**options))
    meta = MoonSettings(**options).to_meta()
    helper = PTMoonHelper(helper_model(), state_dir=tmp_path / "helper", job_id="job-1", site="site-1")
    expected = executor_losses(executor, ctx, rounds=4)
    assert helper_losses(helper, meta, rounds=4) == pytest.approx(expected, rel=1e-6)


def prototypes_meta(round_number):
    """The server's prototypes from round 1 on: classes 0-6 available."""
    if round_number == 0:
        return {}
    g = torch.Generator().manual_seed(50 + round_number)
    available = torch.arange(10) < 7
    return {PROTOTYPES: torch.randn(10, 256, generator=g).numpy(), PROTOTYPE_AVAILABLE: available.numpy()}


@pytest.mark.parametrize("options", FEDSSC_OPTIONS, ids=lambda o: ",".join(o) or "defaults")
def test_every_fedssc_option_gives_the_same_losses_and_uploads_from_both_sides(tmp_path, options):
    own = {k: v for k, v in options.items() if k in FEDSSC_FIELDS}
    moon = {k: v for k, v in options.items() if k not in FEDSSC_FIELDS}
    executor, ctx = executor_site(
        FedSSCExecutor,
        tmp_path,
        training=TrainingSpec(local_epochs=1),
        settings=MoonSettings(**moon),
        fedssc_settings=FedSSCSettings(**own),
    )
    meta = {**MoonSettings(**moon).to_meta(), **FedSSCSettings(**own).to_meta()}
    helper = PTFedSSCHelper(helper_model(), 10, state_dir=tmp_path / "helper", job_id="job-1", site="site-1")
    expected = executor_losses(executor, ctx, 3, prototypes_meta)
    assert helper_losses(helper, meta, 3, prototypes_meta) == pytest.approx(expected, rel=1e-6)
    sent = helper.upload_meta(8)
    for key, value in executor._upload_meta.items():  # the last round's class means and counts
        torch.testing.assert_close(torch.as_tensor(sent[key]), torch.as_tensor(value))


@pytest.mark.parametrize("options", FEDSIAM_DA_OPTIONS, ids=lambda o: ",".join(o) or "defaults")
def test_every_fedsiam_da_option_gives_the_same_losses_from_both_sides(tmp_path, options):
    executor, ctx = executor_site(FedSiamDAExecutor, tmp_path, settings=FedSiamDASettings(**options))
    meta = FedSiamDASettings(**options).to_meta()
    helper = PTFedSiamDAHelper(helper_model(), state_dir=tmp_path / "helper", job_id="job-1", site="site-1")
    expected = executor_losses(executor, ctx, rounds=3)
    assert helper_losses(helper, meta, rounds=3, optimizer=True) == pytest.approx(expected, rel=1e-6)


def test_the_script_recipes_take_every_option_and_send_the_settings_dataclass(tmp_path):
    script = tmp_path / "client.py"
    script.write_text("")
    common = {"model": Network(predictor_hidden_dim=8), "min_clients": 2, "train_script": str(script)}
    for options in MOON_OPTIONS:
        assert MoonScriptRecipe(**common, **options).client_settings() == MoonSettings(**options).to_meta()
    fedssc = {"mu_glob": 2.0, "prototype_clip_norm": 0.5, "light_history": True, "mu_off_rounds": 2}
    recipe = FedSSCScriptRecipe(**common, num_classes=10, prototype_dim=256, mu=3.0, **fedssc)
    expected = {
        **MoonSettings(mu=3.0, light_history=True, mu_off_rounds=2).to_meta(),
        **FedSSCSettings(mu_glob=2.0, prototype_clip_norm=0.5).to_meta(),
    }
    assert recipe.client_settings() == expected
    for options in FEDSIAM_DA_OPTIONS:
        recipe = FedSiamDAScriptRecipe(**common, **options)
        assert recipe.client_settings() == FedSiamDASettings(**options).to_meta()


def test_a_setting_is_checked_once_with_the_same_message_on_every_side(tmp_path):
    with pytest.raises(ValueError, match="temperature must be > 0"):
        MoonExecutor(model=Network(), settings=MoonSettings(temperature=0))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        MoonScriptRecipe(model=Network(), min_clients=2, train_script="client.py", temperature=0)
    meta = {**MoonSettings().to_meta(), "moon_temperature": 0.0}
    helper = PTMoonHelper(Network(), state_dir=tmp_path, job_id="job-1", site="site-1")
    with pytest.raises(ValueError, match=r"invalid setting \(sent by MoonScriptRecipe\): moon_temperature must be > 0"):
        helper.start_round(received(helper.model, 0, meta))
    without = {k: v for k, v in MoonSettings().to_meta().items() if k != "moon_mu"}
    with pytest.raises(ValueError, match="no 'moon_mu'.*MoonScriptRecipe"):
        helper.start_round(received(helper.model, 0, without))
    linear = torch.nn.Linear(2, 2)
    helper = PTMoonHelper(linear, state_dir=tmp_path, job_id="job-1", site="site-1")
    with pytest.raises(ValueError, match="light_history=True needs a ProjectionModel"):
        helper.start_round(received(linear, 0, MoonSettings(light_history=True).to_meta()))


@pytest.mark.parametrize("cls", [MoonExecutor, FedSSCExecutor, FedSiamDAExecutor])
def test_the_local_model_for_cross_site_evaluation_is_the_last_upload(tmp_path, cls):
    executor, ctx = executor_site(cls, tmp_path, training=TrainingSpec(local_epochs=1))
    executor_losses(executor, ctx, rounds=2, meta_of=prototypes_meta)
    round_number, state = executor.load_local_model(ctx)
    assert round_number == 1
    for name, value in trained_in_round(1).items():
        assert torch.equal(state[name], value), name
