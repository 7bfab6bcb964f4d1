/**
 * routerPath (src/http/router-path.ts) against the real router: for each
 * target, the shedder's idea of "an /api/* request" must be the router's
 *. An /api bearer route answers 401 without a token; any
 * other target gets 404 or 400.
 */
import { once } from 'node:events'
import { connect } from 'node:net'
import t from 'tap'
import { routerPath } from '../../src/http/router-path.js'
import { build } from '../helpers/app.js'

const TARGETS = [
  '/api/portfolio/ping', '/api/portfolio/ping?x=/y', '/%61pi/portfolio/ping', '/%61%70%69/portfolio/ping', '/%2561pi/portfolio/ping',
  '/api%2Fportfolio/ping', '//api/portfolio/ping', '/API/portfolio/ping', '/./api/portfolio/ping', '/x/../api/portfolio/ping',
  'http://gw/api/portfolio/ping', 'HTTP://gw:80/api/portfolio/ping', 'https://gw/api/portfolio/ping#f', 'http://gw?/api/portfolio/ping',
  'http:///api/portfolio/ping', 'ftp://gw/api/portfolio/ping', '/api/portfolio/%E0%A4%A', '/health', '/ping', '*'
]

t.test('routerPath says /api/* exactly when the router routes a target to an /api route', async (t) => {
  const { url } = await build(t)
  for (const target of TARGETS) {
    const socket = connect(Number(new URL(url).port), '127.0.0.1')
    await once(socket, 'connect')
    let text = ''
    socket.setEncoding('latin1').on('data', (c: string) => { text += c })
    socket.write(`GET ${target} HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n`)
    await once(socket, 'close')
    const routedToApi = /^HTTP\/1\.1 401 /.test(text)
    t.equal(routerPath(target)?.startsWith('/api/') === true, routedToApi, `${target}: ${text.split('\r\n')[0] ?? '(no answer)'}`)
  }
})

t.test('routerPath: the path without query, decoded as the router decodes it', async (t) => {
  t.equal(routerPath('/api/x?y'), '/api/x')
  t.equal(routerPath('/%61pi/x'), '/api/x')
  t.equal(routerPath('/api%2Fx'), '/api%2Fx', 'reserved characters stay encoded')
  t.equal(routerPath('http://h:1/api/x?q'), '/api/x')
  t.equal(routerPath('http://h?q'), '/')
  t.equal(routerPath('/%E0%A4%A'), undefined, 'bad encoding: the router refuses it')
})
