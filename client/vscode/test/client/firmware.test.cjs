// The project's firmware through the client library against a real fwaid:
// the memory report and the SBOM of a freshly built image (what the
// extension's Memory Report and SBOM commands open), OTA status, and errors
// that name what is wrong.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { Daemon, PROTO_ROOT, ROOT } = require('../support/fixtures.cjs');
const lib = require('../../out/client.js');

test(
  'memory report, SBOM and OTA status of a built image; a missing image is named',
  { timeout: 120000 },
  async (t) => {
    const d = new Daemon(null);
    t.after(() => d.cleanup());
    await d.start();
    fs.cpSync(path.join(ROOT, 'examples', 'stm32vl-blinky'), d.project, { recursive: true });
    fs.rmSync(path.join(d.project, '.fwai'), { recursive: true, force: true });
    execFileSync('make', ['-s', '-C', d.project], { stdio: 'pipe' });
    const elf = path.join(d.project, 'build', 'blinky.elf');
    const client = await lib.FwaiClient.connect({
      address: d.address,
      protoRoot: PROTO_ROOT,
      clientName: 'vscode-test',
    });
    t.after(() => client.close());

    const mem = await lib.memoryReport(client, d.project, elf);
    assert.match(mem.text, /FLASH/);
    assert.match(mem.text, /RAM/);
    const flash = JSON.stringify(mem.report);
    assert.match(flash, /FLASH/);
    // The text section's size is what the ELF says.
    const size = execFileSync('arm-none-eabi-size', ['-A', elf], { encoding: 'utf8' });
    const text = Number(/^\.text\s+(\d+)/m.exec(size)[1]);
    assert.ok(text > 0);
    assert.ok(flash.includes(String(text)), `report does not hold .text's ${text} bytes: ${flash.slice(0, 400)}`);

    const bom = await lib.sbom(client, d.project, elf);
    assert.equal(bom.bomFormat, 'CycloneDX');
    assert.equal(bom.metadata.component.type, 'firmware');
    const sha = crypto.createHash('sha256').update(fs.readFileSync(elf)).digest('hex');
    assert.ok(
      bom.metadata.component.hashes.some((h) => h.alg === 'SHA-256' && h.content === sha),
      JSON.stringify(bom.metadata.component),
    );

    // Register truth: the device is detected from the project (its linker
    // script names the part); a wrong field macro is a finding with its proof.
    const clean = await lib.checkRegisters(client, d.project);
    assert.equal(clean.checked.device, 'STM32F100');
    assert.equal(clean.checked.errors, 0, JSON.stringify(clean.findings));
    const main = path.join(d.project, 'src', 'main.c');
    fs.writeFileSync(
      main,
      fs.readFileSync(main, 'utf8').replace('#define USART_CR1_UE (1u << 13)', '#define USART_CR1_UE (1u << 12)'),
    );
    const wrong = await lib.checkRegisters(client, d.project, { paths: ['src'] });
    assert.deepEqual(
      wrong.findings.map((f) => [f.file, f.line, f.kind, f.symbol]),
      [['src/main.c', 31, 'field-position', 'USART_CR1_UE']],
    );
    await assert.rejects(lib.checkRegisters(client, d.project, { target: 'nrf52840' }), /no SVD for part 'nrf52840'/);

    const ota = await lib.otaStatus(client);
    assert.deepEqual(ota.rollouts, []);
    assert.ok(ota.boards !== null);

    const missing = path.join(d.project, 'build', 'nope.elf');
    await assert.rejects(lib.memoryReport(client, d.project, missing), (e) => e.message.includes('nope.elf'));
  },
);
