/**
 * DECISIONS 21, a body past its size limit: a create's form past 10 MiB, declared or chunked, and update's 400 on a
 * 70 KiB body (its limit is 64 KiB) reach a client that writes its whole body before it reads.
 */
import t from 'tap'
import { writeFirstClientsReadEveryRefusal } from '../../helpers/refusals-test.js'

writeFirstClientsReadEveryRefusal(t, 'size')
