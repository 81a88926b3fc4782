// The official E2B JavaScript SDK's sandbox and command basics against a loopback service.
// Usage: node sandbox.mjs <service url> <api key>; prints one JSON line of results.
import { Sandbox, CommandExitError, TimeoutError } from 'e2b'

const [url, apiKey] = process.argv.slice(2)
const opts = { apiKey, apiUrl: url, sandboxUrl: url, requestTimeoutMs: 10000 }
const results = {}
const check = (name, ok) => { results[name] = Boolean(ok) }

async function errorOf (call) {
  try { await call() } catch (e) { return e } return null
}

const sandbox = await Sandbox.create({ ...opts, envs: { GREETING: 'from-create' } })
try {
  const seen = []
  const run = await sandbox.commands.run('echo "$GREETING $EXTRA"; echo oops >&2', {
    envs: { EXTRA: 'and-run' }, onStdout: (line) => seen.push(line),
  })
  check('commands.run envs', run.stdout === 'from-create and-run\n')
  check('commands.run stderr', run.stderr === 'oops\n' && run.exitCode === 0)
  check('commands.run onStdout', seen.join('').includes('from-create and-run'))
  const failed = await errorOf(() => sandbox.commands.run('exit 3'))
  check('commands.run non-zero is CommandExitError', failed instanceof CommandExitError && failed.exitCode === 3)
  const background = await sandbox.commands.run('sleep 0.2; echo later', { background: true })
  check('commands.run background + wait', (await background.wait()).stdout === 'later\n')
  const slow = await errorOf(() => sandbox.commands.run('sleep 5', { timeoutMs: 300 }))
  check('commands.run timeoutMs ends the command', slow !== null)
  await sandbox.setTimeout(120000)
  const info = await sandbox.getInfo()
  check('setTimeout', info.endAt.getTime() - Date.now() > 60000)
  check('getInfo', info.sandboxId === sandbox.sandboxId && info.state === 'running')
} finally {
  await sandbox.kill()
}
check('kill', !(await sandbox.isRunning()))

// The stream of a command whose sandbox is killed drops: the SDK probes and says so.
const doomed = await Sandbox.create(opts)
const sleeper = await doomed.commands.run('sleep 60', { background: true })
await doomed.kill()
const killed = await errorOf(() => sleeper.wait())
check('kill under a running command is TimeoutError "sandbox was killed"',
  killed instanceof TimeoutError && killed.message.includes('sandbox was killed or reached its end of life'))

// Interfaces only, never a connection: without internet a sandbox has loopback alone.
const interfaces = async (box) => (await box.commands.run('ip -o link')).stdout.split('\n').filter(Boolean).map((line) => line.split(': ')[1]).sort().join(',')
const offline = await Sandbox.create({ ...opts, allowInternetAccess: false })
try {
  check('create allowInternetAccess false is loopback only', (await interfaces(offline)) === 'lo')
} finally {
  await offline.kill()
}
const online = await Sandbox.create({ ...opts, allowInternetAccess: true })
try {
  check('create allowInternetAccess true has an interface out', (await interfaces(online)).split(',').length > 1)
} finally {
  await online.kill()
}
console.log(JSON.stringify(results))
