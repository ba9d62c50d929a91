"""A scripted Responses endpoint for the real-GPU record (standard library only).

It stands in for the model so that `fk-agentd start` can drive one real agent session end to
end on a GPU host with no network: the real client, agent loop, tools, lease broker, NVML,
fastkernels bench and Nsight Compute all run; only the model's choices are scripted. Every
message it writes says it is scripted.

The script, one step per request, read from how many tool results the history holds:
  0 write_file   the candidate file given on the command line
  1 validate
  2 profile_ncu  with a kernel filter that matches the candidate's Triton kernel
  3 profile_ncu  with a filter that matches nothing (the tool must say so and list kernels)
  4 finish

usage: python3 scripted_responses.py PORT CANDIDATE_FILE TARGET KERNEL_REGEX
"""

import http.server
import json
import sys

PORT, CANDIDATE, TARGET, KERNEL = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
TOKEN = "scripted-endpoint-token"


def step_call(n):
    if n == 0:
        with open(CANDIDATE) as f:
            content = f.read()
        return "write_file", {"path": f"candidate/{TARGET}.py", "content": content}
    if n == 1:
        return "validate", {}
    if n == 2:
        return "profile_ncu", {"args": f"-k regex:{KERNEL} -c 1"}
    if n == 3:
        return "profile_ncu", {"args": "-k regex:fk_no_such_kernel -c 1"}
    return "finish", {"summary": "SCRIPTED endpoint: wrote, validated and profiled the candidate."}


def event(kind, data, seq):
    data["type"] = kind
    data["sequence_number"] = seq
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send_response(401)
            self.end_headers()
            return
        items = body.get("input", [])
        n = sum(1 for i in items if i.get("type") == "function_call_output")
        name, args = step_call(n)
        rid = f"rs_scripted_{n}"
        reasoning = {
            "type": "reasoning",
            "id": rid,
            "encrypted_content": f"scripted-{n}",
            "summary": [{"type": "summary_text", "text": f"(scripted) step {n}: {name}"}],
        }
        call = {
            "type": "function_call",
            "id": f"fc_scripted_{n}",
            "call_id": f"call_scripted_{n}",
            "name": name,
            "arguments": json.dumps(args),
            "status": "completed",
        }
        output = [reasoning, call]
        resp = {"id": f"resp_scripted_{n}", "object": "response", "status": "completed",
                "model": "scripted-endpoint", "output": output,
                "usage": {"input_tokens": 1000, "output_tokens": 50, "total_tokens": 1050,
                          "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens_details": {"reasoning_tokens": 10}}}
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        seq = 0
        self.wfile.write(event("response.created", {"response": {**resp, "status": "in_progress", "output": []}}, seq))
        for i, item in enumerate(output):
            seq += 1
            self.wfile.write(event("response.output_item.done", {"output_index": i, "item": item}, seq))
        self.wfile.write(event("response.completed", {"response": resp}, seq + 1))
        self.wfile.flush()
        print(f"scripted endpoint: step {n} -> {name}", file=sys.stderr, flush=True)

    def log_message(self, *a):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
