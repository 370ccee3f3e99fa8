// Read chosen blocks of an NBD export with Xen Orchestra's own client
// (@vates/nbd-client, its TCP client, as XO's backups use it) and write each
// into a backup file at the same offset: what an XO delta backup does with
// the changed blocks of a VDI snapshot that xapi serves over NBD.
//
//   node read-blocks.mjs --address A --port P --export NAME --backup FILE
//       --blocks FILE [--block-size 65536] [--size BYTES] [--cert FILE]
//
// --blocks FILE: one decimal block index per line, or the single word `all`
//   for every block of the export (XO's first, full backup).
// --backup FILE: opened read-write, created if missing, never truncated,
//   except that with --size it is first truncated or extended to exactly
//   BYTES.
// --cert FILE: the server's PEM certificate; the client then upgrades the
//   connection to TLS (NBD_OPT_STARTTLS) as XO does with xapi's NBD server,
//   whose host certificate XO passes as `cert`. The client 3.6.0 hands it
//   to tls.connect() as `cert` with rejectUnauthorized: false: the server's
//   certificate is not checked against it, any server certificate passes.
//
// Prints one JSON line on stdout: {"blocks": n, "bytes": bytes read}.
// Exits 1 with a message on stderr on any error.
//
// The module is imported by name: tests/integration/nbd_util.py runs a copy
// of this file beside a node_modules link to the guest's /opt/zfsng-nbd
// (ES modules do not honour NODE_PATH).

import { open, readFile } from 'node:fs/promises'
import { constants } from 'node:fs'
import { parseArgs } from 'node:util'

// stdout carries the result line only: the client's logger writes through
// console, keep whatever it says on stderr.
console.log = console.info = console.debug = console.error

// How many reads are in flight at once: the client matches the answers to
// the requests by handle, and XO itself reads several blocks at a time.
const CONCURRENCY = 8

function fail(message) {
  const error = new Error(message)
  error.usage = true
  throw error
}

function integer(name, text, min) {
  if (!/^[0-9]+$/.test(text ?? '')) fail(`--${name} wants a decimal integer, not ${JSON.stringify(text)}`)
  const value = Number(text)
  if (!Number.isSafeInteger(value) || value < min) fail(`--${name} ${text} is out of range`)
  return value
}

async function blockList(path, blockSize, exportSize) {
  const text = (await readFile(path, 'utf8')).trim()
  const count = Number((exportSize + BigInt(blockSize) - 1n) / BigInt(blockSize))
  if (text === 'all') {
    return Array.from({ length: count }, (_, i) => i)
  }
  const blocks = []
  for (const line of text.split('\n')) {
    const word = line.trim()
    if (word === '') continue
    const index = integer('blocks entry', word, 0)
    // the client asks for a negative length past the end: refuse first
    if (index >= count) fail(`block ${index} is past the end of the export (${exportSize} bytes, ${count} blocks)`)
    blocks.push(index)
  }
  return blocks
}

async function main() {
  const { values } = parseArgs({
    options: {
      address: { type: 'string' },
      port: { type: 'string' },
      export: { type: 'string', default: '' },
      backup: { type: 'string' },
      blocks: { type: 'string' },
      'block-size': { type: 'string', default: '65536' },
      size: { type: 'string' },
      cert: { type: 'string' },
    },
    strict: true,
  })
  for (const name of ['address', 'port', 'backup', 'blocks']) {
    if (values[name] === undefined) fail(`--${name} is required`)
  }
  const port = integer('port', values.port, 1)
  const blockSize = integer('block-size', values['block-size'], 1)
  const size = values.size === undefined ? undefined : integer('size', values.size, 0)
  const cert = values.cert === undefined ? undefined : await readFile(values.cert, 'utf8')

  const { NbdTcpClient } = await import('@vates/nbd-client')
  const client = new NbdTcpClient(
    { address: values.address, port, exportname: values.export, cert },
    // bounded: a test wants an error, not five reconnections a minute apart
    { connectTimeout: 30e3, messageTimeout: 30e3, readBlockRetries: 2, reconnectRetry: 2 }
  )
  const backup = await open(values.backup, constants.O_RDWR | constants.O_CREAT, 0o644)
  let bytes = 0
  let blocks
  try {
    if (size !== undefined) await backup.truncate(size)
    await client.connect()
    // the export's size is known once connected; the client itself shortens
    // a read of the last block to what is left of an export whose size is
    // not a multiple of the block size
    blocks = await blockList(values.blocks, blockSize, client.exportSize)
    let next = 0
    const worker = async () => {
      while (next < blocks.length) {
        const index = blocks[next++]
        const data = await client.readBlock(index, blockSize)
        const { bytesWritten } = await backup.write(data, 0, data.length, index * blockSize)
        if (bytesWritten !== data.length) throw new Error(`short write of block ${index}`)
        bytes += data.length
      }
    }
    await Promise.all(Array.from({ length: CONCURRENCY }, worker))
    await backup.sync()
  } finally {
    await backup.close()
    await client.disconnect()
  }
  process.stdout.write(JSON.stringify({ blocks: blocks.length, bytes }) + '\n')
}

main().catch(error => {
  process.stderr.write(`read-blocks: ${error.usage ? error.message : (error.stack ?? error)}\n`)
  process.exit(1)
})
