"""What an environment holds, read without the builder: the receipt, pip's RECORD, DeepSpeed's build record and
the health judgement `status`, `install` and `doctor` share."""
