/** The gateway process's entry point, and its only module with side effects. */
import './shared/runtime-guard.js'
import { main } from './main.js'

await main()
