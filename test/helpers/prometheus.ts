/**
 * A reader for the Prometheus text exposition format (version 0.0.4), enough
 * to assert exact values: `name{label="value",...} number` per sample line.
 */
import { request } from 'undici'

export interface Sample {
  name: string
  labels: Record<string, string>
  value: number
}

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g

export function parseExposition (text: string): Sample[] {
  const samples: Sample[] = []
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue
    const match = SAMPLE.exec(line)
    if (match === null) throw new Error(`not a sample line: ${line}`)
    const labels: Record<string, string> = {}
    for (const [, name, value] of (match[2] ?? '').matchAll(LABEL)) labels[name!] = value!
    samples.push({ name: match[1]!, labels, value: Number(match[3]) })
  }
  return samples
}

/** The value of the one sample with this name and exactly these labels; undefined when absent. */
export function valueOf (samples: Sample[], name: string, labels: Record<string, string> = {}): number | undefined {
  const wanted = JSON.stringify(Object.entries(labels).sort())
  return samples.find((s) => s.name === name && JSON.stringify(Object.entries(s.labels).sort()) === wanted)?.value
}

/** GET /metrics and parse it. */
export async function scrape (
  metricsUrl: string
): Promise<{ status: number; contentType: string; samples: Sample[]; text: string }> {
  const res = await request(`${metricsUrl}/metrics`)
  const text = await res.body.text()
  return {
    status: res.statusCode,
    contentType: String(res.headers['content-type']),
    samples: res.statusCode === 200 ? parseExposition(text) : [],
    text
  }
}

/** One sample of an app's registry, read as a scrape would (no listener needed). */
export async function metricOf (
  metrics: { scrape: () => Promise<{ body: string }> },
  name: string,
  labels: Record<string, string> = {}
): Promise<number | undefined> {
  return valueOf(parseExposition((await metrics.scrape()).body), name, labels)
}
