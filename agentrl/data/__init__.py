"""Datasets: RL task files and streams (`tasks`), and the rows and token samples of the supervised and
preference stages (`rows`: reading .jsonl/.json/.parquet/datasets folders; `examples`: rows -> samples).

The RL names are re-exported here, so `from agentrl.data import TaskStream` works as it did when this
package was one module. The stage readers are imported from their modules (`agentrl.data.examples`),
which keeps `import agentrl.data` as light as the RL loop needs.
"""

from agentrl.data.errors import DataError
from agentrl.data.tasks import Task, TaskStream, lm_batches, load_tasks, read_tasks, read_texts, task_stream

__all__ = ["DataError", "Task", "TaskStream", "lm_batches", "load_tasks", "read_tasks", "read_texts", "task_stream"]
