/** The request type: a GET carries no body, so "a GET" and "a bodiless GET" are one rule (call.ts holds timed-out
 * GETs).
 */
import t from 'tap'
import type { EngineRequest } from '../../src/engine-client/types.js'

t.test('a GET with a body does not compile; a POST with one does', async (t) => {
  const post: EngineRequest = { method: 'POST', path: '/api/portfolio/update', requestId: 'r', body: '{}' }
  // @ts-expect-error a GET's body must be undefined
  const get: EngineRequest = { method: 'GET', path: '/api/portfolio/ping', requestId: 'r', body: 'x' }
  t.equal(post.body, '{}')
  t.equal(get.method, 'GET')
})
