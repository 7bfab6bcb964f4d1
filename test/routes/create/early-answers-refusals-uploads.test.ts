/**
 * DECISIONS 21, the fair-upload limits (DECISIONS 23): 429 TOO_MANY_UPLOADS (the per-user cap) and 503
 * UPLOADS_BUSY (the upload connections taken) reach a client that writes its whole body before it reads.
 */
import t from 'tap'
import { writeFirstClientsReadEveryRefusal } from '../../helpers/refusals-test.js'

writeFirstClientsReadEveryRefusal(t, 'uploads')
