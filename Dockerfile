# One image for every role; the compose file picks the command.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY protocol protocol
COPY coordinator coordinator
COPY worker worker
COPY validator validator
COPY trainer trainer
COPY toploc toploc
COPY shardcast shardcast
COPY configs configs
ARG EXTRAS=""
RUN pip install --no-cache-dir ".${EXTRAS}"
ENV PYTHONUNBUFFERED=1
