/**
 * DECISIONS 21, continued: an engine that resets (502) or stops reading
 * (504) mid-upload, and update's 400 on a 70 KiB body (its limit is 64 KiB),
 * reach a client that writes its whole body before it reads.
 */
import t from 'tap'
import { REFUSALS, UPDATE_TOO_LARGE } from '../../helpers/refusals.js'
import { writeFirstClientsReadEveryRefusal } from '../../helpers/refusals-test.js'

writeFirstClientsReadEveryRefusal(t, [...REFUSALS.slice(9), UPDATE_TOO_LARGE])
