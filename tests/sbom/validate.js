// Validates a CycloneDX 1.6 JSON document with the CycloneDX library's own
// strict JSON schema validator (the schemas the library ships; nothing is
// downloaded). Usage: node validate.js FILE. Exit 0: valid; 1: invalid (the
// errors on stderr); 2: could not run.
'use strict';
const fs = require('fs');
let CDX;
try {
  CDX = require('@cyclonedx/cyclonedx-library');
} catch (e) {
  console.error(`cannot load @cyclonedx/cyclonedx-library (run scripts/setup): ${e.message}`);
  process.exit(2);
}
const file = process.argv[2];
if (!file) {
  console.error('usage: node validate.js FILE');
  process.exit(2);
}
const text = fs.readFileSync(file, 'utf8');
const validator = new CDX.Validation.JsonStrictValidator(CDX.Spec.Version.v1dot6);
validator.validate(text).then(
    (errors) => {
      if (errors === null) {
        console.log('valid CycloneDX 1.6');
        process.exit(0);
      }
      console.error(JSON.stringify(errors, null, 2));
      process.exit(1);
    },
    (err) => {
      console.error(`validator failed: ${err.message}`);
      process.exit(2);
    });
