/**
 * The path Fastify's router matches for a request target: the load shedder answers in front of Fastify and must
 * see what the router will see (`/%61pi/...` and absolute targets reach /api; `//api/...` does not).
 */

/** '/api/x' style targets need no work: most requests cost one startsWith. */
export function routerPath (target: string): string | undefined {
  let path = target
  if (path.charCodeAt(0) !== 47 /* '/' */) {
    const absolute = pathOfAbsoluteTarget(path)
    if (absolute === undefined) return undefined
    path = absolute
  }
  // The query or fragment is not part of the path (searched from index 1, as find-my-way does).
  let end = path.length
  for (const delimiter of ['?', '#']) {
    const at = path.indexOf(delimiter, 1)
    if (at !== -1 && at < end) end = at
  }
  path = path.slice(0, end)
  if (path.indexOf('%') === -1) return path
  try {
    // decodeURI leaves reserved characters (%2F among them) encoded, as the router does.
    return decodeURI(path)
  } catch {
    return undefined // the router refuses it too (400)
  }
}

/** find-my-way's getPathFromAbsoluteUrl: http(s)://authority[/path][?query]; undefined where it gives up. */
function pathOfAbsoluteTarget (target: string): string | undefined {
  const schemeEnd = target.indexOf('://')
  if (schemeEnd === -1) return target
  const scheme = target.slice(0, schemeEnd).toLowerCase()
  if (scheme !== 'http' && scheme !== 'https') return target
  const authorityStart = schemeEnd + 3
  const pathStart = target.indexOf('/', authorityStart)
  const queryStart = target.indexOf('?', authorityStart)
  let authorityEnd = pathStart === -1 ? target.length : pathStart
  if (queryStart !== -1 && queryStart < authorityEnd) authorityEnd = queryStart
  if (target.indexOf('#', authorityStart) !== -1 || authorityEnd === authorityStart) return undefined
  const parsed = URL.parse(target)
  if (parsed === null || parsed.protocol !== `${scheme}:` || parsed.host.length === 0) return undefined
  if (authorityEnd === target.length) return '/'
  if (authorityEnd === queryStart) return '/' + target.slice(queryStart)
  return target.slice(pathStart)
}
