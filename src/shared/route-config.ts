/**
 * Route `config.handler`: the name a structured error reports as `function`
 * (`createPortfolio`, `updatePortfolio`), declared once for the gateway and the
 * reference engine alike. Unset: the route's errors are simple.
 */
declare module 'fastify' {
  interface FastifyContextConfig {
    handler?: string
  }
}

export {}
