# One image for every role; the compose file picks the command.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY protocol protocol
COPY runtime runtime
COPY environments environments
COPY engines engines
COPY node node
COPY coordinator coordinator
COPY worker worker
COPY validator validator
COPY trainer trainer
COPY toploc toploc
COPY shardcast shardcast
COPY configs configs
# EXTRAS: an engine extra ("[gpu]") or none. envs (reasoning-gym and verifiers, which configs/coordinator.toml's
# environment needs on every role) in a pip call of its own: verifiers wants mcp<2 and vLLM mcp>=2 (pyproject.toml).
# torch first, from PyTorch's CPU index: `pip install .` alone would satisfy `torch>=2.6` with PyPI's
# multi-GB CUDA build, which a CPU image never uses (the GPU image is Dockerfile.gpu).
ARG EXTRAS=""
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
    && pip install --no-cache-dir ".${EXTRAS}" && pip install --no-cache-dir ".[envs]"
ENV PYTHONUNBUFFERED=1
