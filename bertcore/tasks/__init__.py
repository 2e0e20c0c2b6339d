"""Pre- and post-processing per task. No HTTP, no batching, no ONNX here: text in, model rows out; logits in,
answers out. The server runs the rows in batches and hands each task the logits of its own rows.

Input a task cannot take raises `errors.TaskInputError` (a ValueError naming the field), in every task alike."""
