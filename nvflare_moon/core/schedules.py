"""MOON's cold start (the MOON article's deployment notes, section 4.3, 冷启动问题): μ as a function of the round.

In the first rounds the global model is still near random, and μ·ℓ_con anchors every site's representation to it
(``docs/results.md``: MOON trails FedAvg early in every run). The schedule switches the term off for the first K rounds
and can then raise μ linearly over R rounds. It depends on the round number alone, so every site, a client process
restarted for every task (the simulator with ``-t < -n``) and a continued job apply the same μ in the same round.
"""

from .validation import check_number


def check_mu_schedule(mu: float, mu_off_rounds: int, mu_ramp_rounds: int) -> None:
    """Raise ValueError, naming the argument, unless μ ≥ 0 and K, R are integers ≥ 0."""
    check_number("mu", mu, low=0)
    check_number("mu_off_rounds", mu_off_rounds, low=0, integer=True)
    check_number("mu_ramp_rounds", mu_ramp_rounds, low=0, integer=True)


def scheduled_mu(round_number: int, mu: float, mu_off_rounds: int = 0, mu_ramp_rounds: int = 0) -> float:
    """The μ in force in round ``round_number`` (0-based, the server's round: a site that skips rounds under partial
    participation is not behind):

        μ_r = 0                        r < K
              μ·(r − K + 1)/(R + 1)    K ≤ r < K + R      (R equal steps strictly between 0 and μ)
              μ                        r ≥ K + R

    K = ``mu_off_rounds``, R = ``mu_ramp_rounds``; K = R = 0 (the default) is the paper's constant μ. MOON has no
    previous model in round 0, so its term is absent there anyway: K = 1 changes nothing, K = 3 silences rounds 1
    and 2. Example, μ = 5, K = 2, R = 1: rounds 0, 1, 2, 3, ... get 0, 0, 2.5, 5, 5, ...
    """
    check_mu_schedule(mu, mu_off_rounds, mu_ramp_rounds)
    check_number("round_number", round_number, low=0, integer=True)
    if round_number < mu_off_rounds:
        return 0.0
    if round_number < mu_off_rounds + mu_ramp_rounds:
        return mu * (round_number - mu_off_rounds + 1) / (mu_ramp_rounds + 1)
    return float(mu)


def describe_mu_schedule(mu: float, mu_off_rounds: int, mu_ramp_rounds: int) -> str:
    """The schedule in words, for logs, e.g. ``"cold start: 0 in rounds 0-2, 5 from round 3"``; ``""`` without one."""
    if mu_off_rounds == 0 and mu_ramp_rounds == 0:
        return ""
    parts = [f"0 in rounds 0-{mu_off_rounds - 1}"] if mu_off_rounds else []
    if mu_ramp_rounds:
        last = mu_off_rounds + mu_ramp_rounds - 1
        parts.append(f"ramped in round {last}" if mu_ramp_rounds == 1 else f"ramped in rounds {mu_off_rounds}-{last}")
    parts.append(f"{mu:g} from round {mu_off_rounds + mu_ramp_rounds}")
    return "cold start: " + ", ".join(parts)
