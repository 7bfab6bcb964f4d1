// `tap build`, only when tap's Test class was not built for .taprc's plugins.
// After `npm ci` it was built with tap's defaults (the TypeScript plugin among
// them): tap would rebuild it during the first run, but that run would still
// start every test file with the TypeScript loader (about 2 s of CPU more a
// file). Every later run finds it built: the check costs 0.4 s, a build 7 s.
// A Test class that cannot be loaded at all (a build cut short) is built too:
// tap itself could not start to rebuild it.
import { execFileSync } from 'node:child_process'
import { TapConfig } from '@tapjs/config'

const config = await TapConfig.load()
const built = await import('@tapjs/test').then((test) => test.signature, () => undefined)
if (built !== config.pluginSignature) {
  console.log(built === undefined
    ? 'tap build: tap\'s Test class does not load'
    : 'tap build: the Test class was built for other plugins than .taprc lists')
  execFileSync('npx', ['tap', 'build'], { stdio: 'inherit' })
}
