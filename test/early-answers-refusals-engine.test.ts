/**
 * DECISIONS 21 v4, continued from early-answers-refusals.test.ts: 429
 * TOO_MANY_UPLOADS, 503 UPLOADS_BUSY, an engine that answers mid-upload (with
 * and without an Idempotency-Key), resets (502) or stops reading (504) reach a
 * write-first client, and so does update's 400 on a 70 KiB body.
 */
import t from 'tap'
import { REFUSALS, UPDATE_TOO_LARGE } from './helpers/refusals.js'
import { writeFirstClientsReadEveryRefusal } from './helpers/refusals-test.js'

writeFirstClientsReadEveryRefusal(t, [...REFUSALS.slice(5), UPDATE_TOO_LARGE])
