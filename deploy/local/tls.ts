/**
 * A certificate for haproxy, made at start with openssl: a local CA (its
 * certificate is what clients trust: curl --cacert, the chaos test's
 * clients) and a server certificate it signs for localhost and 127.0.0.1.
 * P-256 keys: quick to make, and what phones negotiate fastest.
 */
import { execFileSync } from 'node:child_process'
import { existsSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'

export interface Certificates {
  /** The CA certificate clients trust. */
  caFile: string
  /** Server certificate, then its key: the one file haproxy's `crt` takes. */
  haproxyPem: string
}

function openssl (args: string[], cwd: string): void {
  execFileSync('openssl', args, { cwd, stdio: ['ignore', 'ignore', 'pipe'], timeout: 30_000 })
}

/** Make the CA and the server certificate in `dir`, unless they are there already (a restart keeps what clients trust).
 *
 */
export function makeCertificates (dir: string): Certificates {
  const caFile = join(dir, 'ca.pem')
  const haproxyPem = join(dir, 'haproxy.pem')
  if (existsSync(caFile) && existsSync(haproxyPem)) return { caFile, haproxyPem }
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes']
  openssl(['req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '30', '-subj', '/CN=portfolio-gateway local CA',
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign'], dir)
  openssl(['req', ...ec, '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=localhost'], dir)
  writeFileSync(join(dir, 'server.ext'), 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n')
  openssl(['x509', '-req', '-in', 'server.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-out', 'server.pem', '-days', '30', '-extfile', 'server.ext'], dir)
  writeFileSync(haproxyPem, readFileSync(join(dir, 'server.pem'), 'utf8') + readFileSync(join(dir, 'server.key'), 'utf8'), { mode: 0o600 })
  return { caFile, haproxyPem }
}
