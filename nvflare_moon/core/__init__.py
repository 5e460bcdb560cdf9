"""The framework-free core every layer sits on: losses, per-round objectives, the local training loop, persisted site
state, aggregation math (FedAvg weights, FedSiam-DA's dual aggregation, SCAFFOLD's controls, FedSSC's prototypes) and
the seeded site sampling. Nothing here imports NVFlare's runtime, so executors (:mod:`nvflare_moon.executors`),
Client API helpers (:mod:`nvflare_moon.client`) and server components (:mod:`nvflare_moon.server`) share one copy of
the math."""
