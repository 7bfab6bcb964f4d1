/**
 * DECISIONS 21: every refusal of a create reaches a client that writes its
 * whole body before it reads. python3's http.client and a raw socket send a
 * 9 MiB form (and a small one) and must read their exact answer at once (helpers/refusals-test.ts):
 * the form parser is detached when the answer goes out, the rest of the body
 * is read and discarded, and the connection ends with FIN, not a reset.
 * This file: the refusals of the form itself; early-answers-refusals-engine
 * and -faults: the upload cap, uploads busy, the engine's answers and faults
 * mid-upload, update; -clients: undici fetch and curl.
 */
import t from 'tap'
import { CHUNKED_TOO_LARGE, REFUSALS } from '../../helpers/refusals.js'
import { writeFirstClientsReadEveryRefusal } from '../../helpers/refusals-test.js'

writeFirstClientsReadEveryRefusal(t, [...REFUSALS.slice(0, 5), CHUNKED_TOO_LARGE])
