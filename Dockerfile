# One image for every role; the compose file picks the command.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY protocol protocol
COPY environments environments
COPY coordinator coordinator
COPY worker worker
COPY validator validator
COPY trainer trainer
COPY toploc toploc
COPY shardcast shardcast
COPY configs configs
# envs: reasoning-gym and verifiers, which configs/coordinator.toml's environment needs on every role
ARG EXTRAS="[envs]"
RUN pip install --no-cache-dir ".${EXTRAS}"
ENV PYTHONUNBUFFERED=1
