FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir -c constraints/docker.txt '.[plot,parquet,cluster]'
RUN useradd --create-home --uid 10001 release && mkdir -p /certs /data /store /results /keystore \
    && chown -R release /certs /data /store /results /keystore
USER release
ENTRYPOINT []
CMD ["secure-release", "--help"]
