"""Seed 000's batch example, verbatim but for base_url, api_key, model and the poll interval.

Run against the local stack (`make demo` does this):  source .devcluster/demo.env
    python examples/seed000_client.py        # in a scratch directory: it writes files to cwd
"""

import json
import os
import time
from pathlib import Path

from openai import OpenAI

client = OpenAI(
    base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"),
    api_key=os.environ["OPENAI_API_KEY"],
)
model = "smollm2"
tickets = {
    "ticket-1": "I cannot sign in.",
    "ticket-2": "Please send a copy of my invoice.",
}
requests = [
    {
        "custom_id": ticket_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": model,
            "messages": [{"role": "user", "content": "Summarize: " + text}],
            "max_completion_tokens": 256,
        },
    }
    for ticket_id, text in tickets.items()
]
Path("requests.jsonl").write_text(
    "".join(json.dumps(row) + "\n" for row in requests), encoding="utf-8"
)

# 2. Upload and submit
with open("requests.jsonl", "rb") as source:
    uploaded = client.files.create(file=source, purpose="batch")
Path("input-file-id.txt").write_text(uploaded.id, encoding="utf-8")

batch = client.batches.create(
    input_file_id=uploaded.id,
    endpoint="/v1/chat/completions",
    completion_window="24h",
    extra_headers={"Idempotency-Key": os.environ.get("IDEMPOTENCY_KEY", "support-run-1")},
)
Path("batch-id.txt").write_text(batch.id, encoding="utf-8")
print("Batch:", batch.id)

# 3. Wait and download
batch_id = Path("batch-id.txt").read_text(encoding="utf-8").strip()
terminal = {"completed", "cancelled", "failed", "expired"}
while True:
    finished = client.batches.retrieve(batch_id)
    print(finished.status, finished.request_counts)
    if finished.status in terminal:
        break
    time.sleep(float(os.environ.get("POLL_SECONDS", "5")))

for file_id, filename in [
    (finished.output_file_id, "results.jsonl"),
    (finished.error_file_id, "errors.jsonl"),
]:
    text = client.files.content(file_id).text if file_id else ""
    Path(filename).write_text(text, encoding="utf-8")

# 4. Match results and review failures
successful = set()
for line in Path("results.jsonl").read_text(encoding="utf-8").splitlines():
    row = json.loads(line)
    response = row.get("response")
    if row.get("error") or not response or response["status_code"] != 200:
        continue
    successful.add(row["custom_id"])
    answer = response["body"]["choices"][0]["message"]["content"]
    print(row["custom_id"], tickets.get(row["custom_id"]), answer)

remaining = [row for row in requests if row["custom_id"] not in successful]
Path("retry.jsonl").write_text(
    "".join(json.dumps(row) + "\n" for row in remaining), encoding="utf-8"
)
print("Items to review:", len(remaining))
