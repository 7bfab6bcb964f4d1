/** Route `config.handler`: the `function` a structured error reports; unset, the route's errors are simple. */
declare module 'fastify' {
  interface FastifyContextConfig {
    handler?: string
  }
}

export {}
