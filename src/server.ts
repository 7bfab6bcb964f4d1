/**
 * The gateway process's entry point, and its only module with side effects:
 * `node dist/src/server.js` (npm start, the image's CMD).
 */
import './shared/runtime-guard.js'
import { main } from './main.js'

await main()
