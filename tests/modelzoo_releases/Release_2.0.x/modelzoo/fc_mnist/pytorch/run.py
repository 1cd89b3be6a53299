# isort: off
import os
import sys

sys.path.append(os.path.join(os.path.dirname(__file__), "../../.."))
# isort: on
from modelzoo.common.pytorch.run_utils import get_params_from_args


def main():
    params = get_params_from_args()
    from modelzoo.fc_mnist.pytorch.utils import set_defaults

    set_defaults(params)

    from modelzoo.common.pytorch.run_utils import main
    from modelzoo.fc_mnist.pytorch.data import (
        get_eval_dataloader,
        get_train_dataloader,
    )
    from modelzoo.fc_mnist.pytorch.model import MNISTModel

    main(params, MNISTModel, get_train_dataloader, get_eval_dataloader)


if __name__ == '__main__':
    main()
