/**
 * DECISIONS 21, continued from early-answers-refusals.test.ts: 429
 * TOO_MANY_UPLOADS, 503 UPLOADS_BUSY and an engine that answers mid-upload
 * (with and without an Idempotency-Key) reach a write-first client. The
 * engine's faults and update: early-answers-refusals-faults.test.ts.
 */
import t from 'tap'
import { REFUSALS } from '../../helpers/refusals.js'
import { writeFirstClientsReadEveryRefusal } from '../../helpers/refusals-test.js'

writeFirstClientsReadEveryRefusal(t, REFUSALS.slice(5, 9))
