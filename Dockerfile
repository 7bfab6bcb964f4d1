# syntax=docker/dockerfile:1
# Node.js 24, in maintenance LTS until 2028-04-30 (docs/decisions/0035-a-maintained-runtime.md). The compose
# file passes the same line, and test/shared/runtime.test.ts keeps both, the manifests and package.json in step.
ARG NODE_MAJOR=24
# Build stage: compile the TypeScript with the dev dependencies.
FROM node:${NODE_MAJOR}-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY schemas ./schemas
COPY src ./src
RUN npx tsc -p tsconfig.build.json

# Runtime stage: production dependencies and compiled JS only, as the unprivileged `node` user.
FROM node:${NODE_MAJOR}-bookworm-slim
ENV NODE_ENV=production PORT=3000 HOST=0.0.0.0
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force
COPY --from=build /app/dist ./dist
# The reference engine (same image: `node dist/src/reference-engine/standalone.js`) keeps images in
# ENGINE_IMAGE_DIR, a volume its instances share; owned by `node` here so a new named volume mounted
# on it starts writable for the unprivileged user (deploy/compose).
RUN mkdir -p /var/lib/portfolio-engine/images && chown -R node:node /var/lib/portfolio-engine
USER node
# 3000: the API; 9464: Prometheus /metrics (METRICS_PORT), for the scraper only, never the public load balancer.
# The reference engine listens on ENGINE_PORT (4000 by default).
EXPOSE 3000 9464
# /health answers 500 while draining, so the orchestrator stops routing here first.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:' + process.env.PORT + '/health').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
# Runs node directly (not npm) so SIGTERM reaches the process and the graceful close runs.
CMD ["node", "dist/src/server.js"]
