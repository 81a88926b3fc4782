// The official E2B JavaScript SDK's file and sandbox calls against a loopback service.
// Usage: node files.mjs <service url> <api key>; prints one JSON line of results.
import { Sandbox, FileType } from 'e2b'

const [url, apiKey] = process.argv.slice(2)
const opts = { apiKey, apiUrl: url, sandboxUrl: url, requestTimeoutMs: 10000 }
const results = {}
const check = (name, ok) => { results[name] = Boolean(ok) }

const sandbox = await Sandbox.create({ ...opts, metadata: { 'created-by': 'piship-js' } })
try {
  const info = await sandbox.files.write('js/a.txt', 'hello from js')
  check('files.write', info.path === '/home/user/js/a.txt')
  check('files.read', (await sandbox.files.read('js/a.txt')) === 'hello from js')
  const many = await sandbox.files.write([{ path: 'js/m1.txt', data: 'one' }, { path: 'js/m2.txt', data: 'two' }])
  check('files.write several entries', many.length === 2 && (await sandbox.files.read('js/m2.txt')) === 'two')
  await sandbox.files.remove('js/m1.txt')
  await sandbox.files.remove('js/m2.txt')
  const entries = await sandbox.files.list('js')
  check('files.list', entries.length === 1 && entries[0].type === FileType.FILE)
  check('files.exists', (await sandbox.files.exists('js/a.txt')) && !(await sandbox.files.exists('js/none')))
  check('files.getInfo', (await sandbox.files.getInfo('js/a.txt')).size === 13)
  check('files.makeDir', (await sandbox.files.makeDir('js/d')) === true && (await sandbox.files.makeDir('js/d')) === false)
  const moved = await sandbox.files.rename('js/a.txt', 'js/d/b.txt')
  check('files.rename', moved.path === '/home/user/js/d/b.txt')
  await sandbox.files.remove('js/d')
  check('files.remove', !(await sandbox.files.exists('js/d')))
  let missing = ''
  try { await sandbox.files.read('js/none') } catch (e) { missing = e.constructor.name }
  check('files.read missing is FileNotFoundError', missing === 'FileNotFoundError')
  const upload = await fetch(await sandbox.uploadUrl('js/up.txt'), {
    method: 'POST', body: (() => { const f = new FormData(); f.append('file', new Blob(['up!']), 'js/up.txt'); return f })(),
  })
  check('uploadUrl', upload.status === 200)
  const download = await fetch(await sandbox.downloadUrl('js/up.txt'))
  check('downloadUrl', download.status === 200 && (await download.text()) === 'up!')
  const listed = await Sandbox.list({ ...opts, query: { metadata: { 'created-by': 'piship-js' } } }).nextItems()
  check('Sandbox.list', listed.length === 1 && listed[0].sandboxId === sandbox.sandboxId)
  const again = await Sandbox.connect(sandbox.sandboxId, opts)
  check('Sandbox.connect', (await again.files.read('js/up.txt')) === 'up!')
  check('getHost', sandbox.getHost(8000).startsWith(`8000-${sandbox.sandboxId}.localhost:`))
  const run = await sandbox.commands.run('echo hi')
  check('commands.run', run.stdout === 'hi\n')
} finally {
  await sandbox.kill()
}
console.log(JSON.stringify(results))
