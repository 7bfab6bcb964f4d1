/**
 * DECISIONS 21, the engine's own answer: an engine that refuses a create mid-upload (with and without an
 * Idempotency-Key) has its answer reach a client that writes its whole body before it reads.
 */
import t from 'tap'
import { writeFirstClientsReadEveryRefusal } from '../../helpers/refusals-test.js'

writeFirstClientsReadEveryRefusal(t, 'engine')
