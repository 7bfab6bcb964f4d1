/**
 * DECISIONS 21, the engine's faults: an engine that resets (502) or stops reading (504) mid-upload; the
 * gateway's answer reaches a client that writes its whole body before it reads.
 */
import t from 'tap'
import { writeFirstClientsReadEveryRefusal } from '../../helpers/refusals-test.js'

writeFirstClientsReadEveryRefusal(t, 'engine-faults')
