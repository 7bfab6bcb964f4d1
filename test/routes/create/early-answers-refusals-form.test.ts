/**
 * DECISIONS 21: every refusal of a create reaches a client that writes its
 * whole body before it reads. python3's http.client and a raw socket send a
 * 9 MiB form (and a small one) and must read their exact answer at once (test/helpers/refusals-test.ts):
 * the form parser is detached when the answer goes out, the rest of the body
 * is read and discarded, and the connection ends with FIN, not a reset.
 * One file a kind of refusal (test/helpers/refusals.ts, REFUSAL_KINDS); this one: the form's own fields and parts
 * (a bad field before or after the image, not an image, a second file). The clients people use most besides
 * write-first ones: early-answers-refusals-clients.test.ts.
 */
import t from 'tap'
import { writeFirstClientsReadEveryRefusal } from '../../helpers/refusals-test.js'

writeFirstClientsReadEveryRefusal(t, 'form')
